"""CARD's parallel drafting (notebook 09): a draft model keeps drafting into a shared tree while the target verifies.

tree (`CardTree`: the drafter's tree of scored paths and its cache) -> drafter (the drafter in the caller's
thread or a worker thread) -> process (the drafter in a forked process, its tree shared through shared memory).
"""
