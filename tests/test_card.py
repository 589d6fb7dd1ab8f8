"""CARD (methods/card.py, mechanisms/card/tree.py, card/drafter.py): the drafter's tree against a by-hand top-K beam, hit/miss
corrections, thread and process modes = sync mode, clean shutdown of the worker thread / drafter process,
process-mode sampling against the target's exact distribution, bad settings. The mechanism runs at a fixed width
(width=8): width="auto" may stop drafting where it does not pay (tests/test_budget.py tests that)."""
from __future__ import annotations

import multiprocessing
import os
import threading

import pytest
import torch

from specdec_lib import generate
from specdec_lib.mechanisms import kv_cache
from specdec_lib.mechanisms.card.drafter import ThreadDrafter
from specdec_lib.mechanisms.card.process import PROCESS_NAME, DrafterProcess, wait_exited
from specdec_lib.mechanisms.card.tree import CardTree
from specdec_lib.methods import card as card_module
from specdec_lib.methods.card import WORKER_NAME, Card

from helpers import random_lm, repeating_prompt

pytestmark = pytest.mark.usefixtures("one_thread")
K = 3


@pytest.fixture(scope="module")
def models():
    target = random_lm("llama", seed=0, layers=3, logit_scale=20.0)
    draft = random_lm("qwen2", seed=100, layers=1, logit_scale=20.0)
    return target, draft, repeating_prompt(24, 0, target.config.vocab_size)[0].tolist()


def next_logits(model, ids):
    return model(input_ids=torch.tensor([ids])).logits[0, -1]  # (V,), no cache


def by_hand_layer(draft, committed, paths, scores, width):
    """The global top-`width` of the top-`width` children of each path: [(token, score, parent index)]."""
    cand = []
    for i, (path, base) in enumerate(zip(paths, scores)):
        logp = torch.log_softmax(next_logits(draft, committed + path), -1)
        top = torch.topk(logp, width)
        cand += [(int(t), base + float(v), i) for v, t in zip(top.values, top.indices)]
    return sorted(cand, key=lambda c: -c[1])[:width], cand


def path(tree, i):
    out = []
    while i != -1:
        out.append(tree.tokens[i])
        i = tree.parents[i]
    return out[::-1]


@torch.inference_mode()
def test_layers_match_a_by_hand_top_k_beam(models):
    _, draft, ids = models
    tree = CardTree(draft, K, ids)
    frontier_paths, frontier_scores, frontier_nodes = [[]], [0.0], [-1]
    for layer in range(4):
        tree.grow()
        best, cand = by_hand_layer(draft, ids, frontier_paths, frontier_scores, K)
        assert len(tree.level2) == len(cand) == K * len(frontier_paths)  # the K x K secondary cache
        new = tree.frontier
        assert [tree.tokens[i] for i in new] == [t for t, _, _ in best], layer
        assert [tree.parents[i] for i in new] == [frontier_nodes[p] for _, _, p in best], layer
        assert [tree.depths[i] for i in new] == [layer + 1] * K
        assert torch.allclose(torch.tensor([tree.scores[i] for i in new], dtype=torch.float64),
                              torch.tensor([s for _, s, _ in best], dtype=torch.float64), atol=1e-8)
        frontier_paths = [path(tree, i) for i in new]
        frontier_scores = [tree.scores[i] for i in new]
        frontier_nodes = new
        # the tree-attention forward gives each fed node the logits sequential decoding of its path gives
        for i in range(tree.fed):
            assert torch.allclose(tree.logits[i], next_logits(draft, ids + path(tree, i)), atol=1e-8)
    assert tree.layers == 4 and kv_cache.cache_length(tree.cache) == len(ids) + tree.fed == len(ids) + 3 * K


@torch.inference_mode()
def test_hit_prunes_to_the_subtree_and_miss_resets(models):
    _, draft, ids = models
    tree = CardTree(draft, K, ids)
    for _ in range(4):  # depths 1-3 fed, depth 4 the frontier
        tree.grow()
    b = next(i for i in range(tree.fed) if tree.depths[i] == 2 and tree.children(i))  # a fed depth-2 node
    a = tree.parents[b]
    kids_b = tree.children(b)
    grandkids = [i for i in range(len(tree)) if tree.parents[i] in kids_b]
    logits_b = tree.logits[b].clone()
    committed = ids + [tree.tokens[a], tree.tokens[b]]
    assert tree.correct(committed) is True  # hit: the target's token b is a child of a
    assert tree.committed == committed and tree.ctx == committed
    assert len(tree) == len(kids_b) + len(grandkids) and tree.depth == 2  # only b's subtree, b = the new root
    assert torch.equal(tree.root_logits, logits_b)
    assert kv_cache.cache_length(tree.cache) == len(committed) + tree.fed
    for i in range(tree.fed):  # the compacted KV still gives every kept node its own logits
        assert torch.allclose(tree.logits[i], next_logits(draft, committed + path(tree, i)), atol=1e-8)
    tree.grow()  # the next layer hangs off the compacted cache
    for i in range(tree.fed):
        assert torch.allclose(tree.logits[i], next_logits(draft, committed + path(tree, i)), atol=1e-8)
    # miss: a token that is not a child of the root
    wrong = next(t for t in range(draft.config.vocab_size) if t not in {tree.tokens[c] for c in tree.children(-1)})
    committed = committed + [wrong]
    assert tree.correct(committed) is False
    assert len(tree) == 0 and tree.root_logits is None and tree.ctx == committed[:-1]
    tree.grow()  # the reset: feeds the correct token, expands the new root
    logp = torch.log_softmax(next_logits(draft, committed), -1)
    assert [tree.tokens[i] for i in tree.frontier] == torch.topk(logp, K).indices.tolist()


def drafter_threads():
    """Drafter threads and drafter processes still running (none may outlive a generate call)."""
    return ([t for t in threading.enumerate() if t.name == WORKER_NAME]
            + [p for p in multiprocessing.active_children() if p.name == PROCESS_NAME])


def in_time(fn, seconds=120):
    """Run fn in a helper thread: (result, exception), failing the test if it hangs."""
    box = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc
    helper = threading.Thread(target=run)
    helper.start()
    helper.join(seconds)
    assert not helper.is_alive(), "generate hung"
    wait_exited(helper)  # the next call may fork (process mode): no lock of this thread's may be held then
    return box.get("result"), box.get("error")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the OS's threads from /proc (Linux)")
def test_a_closed_thread_drafter_has_left_the_os_before_a_fork(models, monkeypatch):
    """`join` returns before a thread's native exit handlers run (MKL frees its buffers under a lock there); a fork
    meanwhile copies that lock held, and the process drafter's first matrix product spins forever (a CI run hung
    so). Thread mode's close waits until its worker is gone from the OS; unwaited, about one close in four here
    returned before it was."""
    target, _, ids = models
    left = []
    original = ThreadDrafter.close

    def close(self):
        worker = self.worker
        original(self)
        left.append(os.path.exists(f"/proc/self/task/{worker.native_id}"))

    monkeypatch.setattr(ThreadDrafter, "close", close)
    for _ in range(20):
        result = generate("card", target, ids, 5, draft=target, width=8, mode="thread")
        assert len(result.new_tokens) == 5
    assert len(left) == 20 and not any(left)


@pytest.mark.parametrize("self_draft", [False, True])
def test_thread_mode_gives_the_sync_greedy_tokens(models, self_draft):
    target, draft, ids = models
    draft = target if self_draft else draft
    reference = generate("hf", target, ids, 40).new_tokens
    sync = generate("card", target, ids, 40, draft=draft, width=8, debug=True)
    result, error = in_time(lambda: generate("card", target, ids, 40, draft=draft, width=8, mode="thread", debug=True))
    assert error is None, error
    assert sync.new_tokens == result.new_tokens == reference
    stats = result.stats
    assert stats["config"]["mode"] == "thread" and stats["target_busy"]
    # a layer is discarded only when a correction (one per verified step: a hit or a miss) lands while it is being
    # drafted, and the worker applies that correction before it drafts again: at most one per correction
    corrections = stats["hits"] + stats["misses"]
    assert corrections == len(stats["steps"]) == len(result.accept_lengths)  # every step is judged
    assert isinstance(stats["discarded_layers"], int) and 0 <= stats["discarded_layers"] <= corrections
    assert len(stats["draft_busy"]) == stats["draft_layers"] + stats["discarded_layers"]  # every draft forward
    if self_draft:
        assert sync.stats["hit_rate"] > 0.5 and sync.mat > 2
    assert all(s["hit"] in (True, False) for s in result.stats["steps"])
    assert not drafter_threads()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_concurrent_modes_stop_at_eos_and_max_new_tokens(models, mode):
    target, _, ids = models
    reference = generate("hf", target, ids, 12).new_tokens
    for n in (1, 2, 5):
        result, error = in_time(lambda: generate("card", target, ids, n, draft=target, width=8, mode=mode))
        assert error is None and result.new_tokens == reference[:n]
    eos = reference[6]
    result, error = in_time(lambda: generate("card", target, ids, 12, draft=target, width=8, mode=mode,
                                             eos_token_id=eos))
    assert error is None and result.new_tokens == reference[:reference.index(eos) + 1]
    assert not drafter_threads()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_concurrent_modes_shut_down_when_observe_raises(models, monkeypatch, mode):
    target, draft, ids = models
    calls = []
    original = Card.observe

    def observe(self, state, verdict):
        calls.append(1)
        if len(calls) == 3:
            raise KeyError("observe failed")
        return original(self, state, verdict)

    monkeypatch.setattr(Card, "observe", observe)
    _, error = in_time(lambda: generate("card", target, ids, 30, draft=draft, width=8, mode=mode))
    assert isinstance(error, KeyError) and len(calls) == 3
    assert not drafter_threads()


def test_a_worker_exception_reaches_the_caller(models, monkeypatch):
    target, draft, ids = models
    calls = []
    original = CardTree.forward

    def forward(self, job):
        calls.append(threading.current_thread().name)
        if len(calls) == 4:
            raise ValueError("drafter failed")
        return original(self, job)

    monkeypatch.setattr(CardTree, "forward", forward)
    _, error = in_time(lambda: generate("card", target, ids, 30, draft=draft, width=8, mode="thread"))
    assert isinstance(error, RuntimeError) and isinstance(error.__cause__, ValueError), error
    assert set(calls) == {WORKER_NAME}  # only the worker drafts in thread mode
    assert not drafter_threads()


@pytest.mark.parametrize("settings, exc", [
    (dict(width=0), ValueError), (dict(width=True), TypeError), (dict(ratio=0), ValueError),
    (dict(ratio=2.0), TypeError), (dict(draft_depth=0), ValueError), (dict(mode="async"), ValueError),
    (dict(correction=0), TypeError), (dict(correction=False, mode="thread"), ValueError),
    (dict(mode="thread", draft_device="cuda"), ValueError), (dict(draft_device="cpu"), ValueError),
    (dict(tree=0), ValueError), (dict(tree=8, query=4), ValueError), (dict(tree=8, correction=False), ValueError)])
def test_bad_settings_raise(models, settings, exc):
    target, draft, ids = models
    with pytest.raises(exc):
        Card(**settings)
    with pytest.raises(exc):
        generate("card", target, ids, 4, draft=draft, **settings)
    assert not drafter_threads()


def test_busy_intervals_overlap_and_timeline():
    """bench.timeline: the overlap of two interval lists, intervals from step records, and the Gantt figure."""
    from types import SimpleNamespace

    from specdec_lib import viz
    from specdec_lib.bench import timeline

    got = timeline.overlap([(0.0, 1.0), (2.0, 3.0), (2.5, 3.5)], [(0.5, 2.25), (3.0, 4.0)])
    assert abs(got["both_s"] - (0.5 + 0.25 + 0.5)) < 1e-12 and got["wall_s"] == 4.0
    steps = [dict(draft_us=1000.0, verify_ms=2.0, update_us=500.0)] * 2
    busy = timeline.busy_from_steps(SimpleNamespace(stats={"steps": steps}))
    assert [tuple(round(t, 9) for t in span) for span in busy["draft"]] == [(0.0, 0.001), (0.0035, 0.0045)]
    assert timeline.overlap(busy["draft"], busy["target"])["both_s"] == 0  # a sequential method never overlaps
    fig = viz.timeline_figure({"draft_model": busy})
    assert [t.name for t in fig.data] == ["draft_model: draft", "draft_model: target"]
    assert [round(b, 9) for b in fig.data[1].base] == [1.0, 4.5] and list(fig.data[1].x) == [2.0, 2.0]  # ms


# ---------------------------------------------------------------- process mode (mechanisms/card/process.py)

@pytest.mark.parametrize("self_draft", [False, True])
def test_process_mode_gives_the_sync_greedy_tokens(models, self_draft):
    target, draft, ids = models
    draft = target if self_draft else draft
    reference = generate("hf", target, ids, 40).new_tokens
    result, error = in_time(lambda: generate("card", target, ids, 40, draft=draft, width=8, mode="process", debug=True))
    assert error is None, error
    assert result.new_tokens == reference
    stats = result.stats
    assert stats["config"]["mode"] == "process" and len(stats["target_busy"]) == result.target_forwards
    assert len(stats["draft_busy"]) == stats["draft_layers"] > 0  # every draft forward, timed in the child
    assert all(s["hit"] in (True, False) for s in stats["steps"])
    assert stats["hits"] + stats["misses"] == result.target_forwards
    if self_draft:  # the drafter is the target: every chain is accepted whole (hits depend on timing here)
        assert result.mat > 2 and all(s["accepted"] == s["tree_size"] for s in stats["steps"])
    assert torch.get_num_threads() == 1 and not drafter_threads()  # the one_thread fixture's value is back


@pytest.mark.parametrize("failure", ["raise", "die"])
def test_a_drafter_process_failure_reaches_the_caller(models, monkeypatch, failure):
    """The child raising (its traceback comes back) or dying without a word: a clear error, no hang, no orphan."""
    target, draft, ids = models
    parent, calls = os.getpid(), []
    original = CardTree.forward

    def forward(self, job):
        calls.append(os.getpid())
        if os.getpid() != parent and len(calls) == 4:  # the 4th draft forward in the child (fork copied the patch)
            if failure == "die":
                os._exit(3)
            raise ValueError("drafter failed")
        return original(self, job)

    monkeypatch.setattr(CardTree, "forward", forward)
    _, error = in_time(lambda: generate("card", target, ids, 30, draft=draft, width=8, mode="process"))
    assert isinstance(error, RuntimeError), error
    assert ("ValueError: drafter failed" in str(error)) if failure == "raise" else ("died" in str(error))
    assert calls == [] and not drafter_threads()  # only the child drafts


def test_process_mode_sampling_matches_the_target_distribution():
    """Speculative sampling on chains drawn from the logits the child shares: chi-square against the exact
    distribution of 2-token continuations (the contract test does this for sync mode)."""
    from specdec_lib.bench.lossless import lossless_check

    target = random_lm("llama", vocab=8, layers=1, hidden=16, seed=3, logit_scale=20.0)
    draft = random_lm("qwen2", vocab=8, layers=1, hidden=16, seed=2, logit_scale=20.0)
    base = [1, 2, 3]
    ids = torch.tensor([base + generate("autoregressive", target, base, 12).new_tokens])
    report = lossless_check("card", target, ids, length=2, n_samples=400, draft=draft, temperature=1.3,
                            mode="process", width=2, ratio=1)
    assert report.passed, str(report)
    assert not drafter_threads()


def test_process_mode_refuses_a_draft_off_the_cpu(models):
    _, draft, ids = models
    with pytest.raises(ValueError, match="draft_device='cpu'"):
        DrafterProcess(random_lm("qwen2", seed=1, layers=1).to("meta"), 2, ids, 4, share_logits=False)


def test_no_correction_ablation_is_lossless_and_waits_out_a_stale_tree(models):
    """Table 2's "query but don't correct": same tokens; after a miss the target verifies nothing but its own
    token (empty chains) until the drafter, out of depth, restarts; with the correction fewer steps are needed."""
    target, draft, ids = models
    reference = generate("hf", target, ids, 40).new_tokens
    for drafter in (draft, target):
        plain = generate("card", target, ids, 40, draft=drafter, width=8, debug=True)
        ablated = generate("card", target, ids, 40, draft=drafter, correction=False, draft_depth=6, debug=True)
        assert plain.new_tokens == ablated.new_tokens == reference
        assert ablated.stats["config"]["correction"] is False and ablated.stats["misses"] > 0
        steps = ablated.stats["steps"]
        stale = [i for i in range(1, len(steps)) if steps[i - 1]["hit"] is False and steps[i]["tree_size"] == 0]
        assert stale or drafter is target, "a miss leaves the target without a chain until the drafter restarts"
    # the target drafting for itself: every miss is the drafter running out of depth, which the correction avoids
    assert ablated.target_forwards > plain.target_forwards


def test_card_explorer_runs_every_mode_and_redraws(tiny_pair):
    """viz.card_explorer on the shipped pair: one row and two timeline lanes per run, the progress bar full,
    and a new K redraws with that K."""
    from specdec_lib import viz

    prompts = [{"id": "a", "prompt": "def add(a, b):\n    return"}, "import os\n"]
    box = viz.card_explorer(tiny_pair, prompts, max_new_tokens=12, width=3, ratio=1, modes=("sync", "process"))
    rows, fig = box.state["rows"], box.state["figure"]
    assert list(rows.run) == ["draft_model", "card (sync)", "card (process)"]
    assert rows.overlap[0] == 0 and rows.hit_rate[1:].between(0, 1).all() and (rows.mat >= 1).all()
    assert len(fig.data) == 6 and "K=3" in fig.layout.title.text
    controls, stack = {}, [box]
    while stack:
        widget = stack.pop()
        controls[type(widget).__name__ + ":" + str(getattr(widget, "description", ""))] = widget
        stack.extend(getattr(widget, "children", ()))
    assert controls["IntProgress:"].value == controls["IntProgress:"].max == 3
    controls["IntSlider:width K"].value = 5
    box.update()
    assert "K=5" in box.state["figure"].layout.title.text and not drafter_threads()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_drafter_on_the_cpu_beside_the_target(models, mode):
    """draft_device='cpu' (the drafter beside a GPU target): same tokens; a draft already on the CPU is used as
    it is, a draft elsewhere is copied once (float32) and the copy reused."""
    target, draft, ids = models
    assert card_module.draft_on(draft, "cpu") is draft and card_module.draft_on(draft, None) is draft
    reference = generate("hf", target, ids, 30).new_tokens
    result, error = in_time(lambda: generate("card", target, ids, 30, draft=draft, width=8, mode=mode,
                                             draft_device="cpu"))
    assert error is None, error
    assert result.new_tokens == reference and result.stats["config"]["draft_device"] == "cpu"
    assert result.stats["draft_layers"] > 0 and not drafter_threads()


def test_auto_width_never_judges_drafting_by_the_prompts_prefill(models, monkeypatch):
    """width="auto" judges drafted steps by their measured time against plain ones: the first step's time is the
    prompt's prefill (tens of plain steps on a long prompt), not a drafted step's, so it is never recorded (it
    used to turn the drafting off before any drafted step was seen). In sync mode that step is plain, and the
    drafter's own prefill of the prompt runs in the first drafted step, which is recorded: it is what trying the
    draft costs."""
    from specdec_lib.mechanisms.budget.side import SideBudget

    target, _, ids = models
    records = []
    record = SideBudget.record
    monkeypatch.setattr(SideBudget, "record", lambda self, *a: records.append(a) or record(self, *a))
    result = generate("card", target, ids, 24, draft=target, debug=True)  # a self-draft: drafting pays
    steps = result.stats["steps"]
    assert steps[0]["hit"] is None and steps[0]["tree_size"] == 0  # the prompt's step is plain ...
    assert steps[1]["hit"] is not None  # ... the next one drafts (the warm-up is on) ...
    drafted = [s for s in steps[1:] if s["hit"] is not None]  # (a plain step's hit is None)
    assert len(records) == len(drafted) > 0  # ... and every drafted step was judged


def test_a_drafter_process_drafts_after_the_parent_ran_threads(models):
    """libgomp is not fork-safe: a child forked after the parent's multi-threaded region deadlocks at its first
    multi-threaded op (an H200 lease hung so, the parent at 16 threads). The child runs one thread: it drafts."""
    _, draft, ids = models
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(512, 512)
        (x @ x).sum()  # the parent's thread pool is up now
        drafter = DrafterProcess(draft, 2, ids, 4, share_logits=False, wait_s=30.0)
        try:
            with drafter.query(lambda tree, since: tree.depth >= 2, grow_after=True) as (tree, _):
                assert tree.depth >= 2  # two layers drafted by the child, not a TimeoutError after 30 s
        finally:
            drafter.close()
    finally:
        torch.set_num_threads(before)
    assert drafter.layers >= 2


@pytest.mark.parametrize("mode", ["sync", "thread", "process"])
def test_tree_verification_is_lossless_in_every_mode(models, mode):
    """tree=N (the extension: the target verifies the drafter's N best nodes, not one chain) gives HF's greedy
    tokens with a self-draft and an unrelated one; with the self-draft, a step verifies siblings and more than one
    token is accepted per step."""
    target, draft, ids = models
    reference = generate("hf", target, ids, 40).new_tokens
    for name, d in (("self", target), ("unrelated", draft)):
        result, error = in_time(lambda: generate("card", target, ids, 40, draft=d, width=4, tree=6, mode=mode,
                                                 debug=True))
        assert error is None, error
        assert result.new_tokens == reference, (name, mode)
        steps = result.stats["steps"]
        assert all(s["tree_size"] <= 6 for s in steps) and result.stats["config"]["tree"] == 6
        if name == "self":
            assert any(s["tree_size"] > s["depth"] for s in steps) and result.mat > 2
    assert not drafter_threads()


def test_tree_verification_sampling_matches_the_target_distribution():
    """Under sampling the drafter's best nodes are verified by the loop's tree walk: chi-square against the exact
    distribution of 3-token continuations, and drafts are accepted (the check tests the walk, not plain steps)."""
    from specdec_lib.bench.lossless import lossless_check

    target = random_lm("llama", vocab=8, layers=1, hidden=16, seed=3, logit_scale=20.0)
    draft = random_lm("qwen2", vocab=8, layers=1, hidden=16, seed=2, logit_scale=20.0)
    base = [1, 2, 3]
    ids = torch.tensor([base + generate("autoregressive", target, base, 12).new_tokens])
    settings = dict(width=3, ratio=1, tree=4)  # a fixed width: every step drafts
    report = lossless_check("card", target, ids, length=3, n_samples=1500, draft=draft, temperature=1.3, **settings)
    assert report.passed, str(report)
    accepted = sum(generate("card", target, ids, 3, draft=draft, temperature=1.0, seed=s, **settings
                            ).stats["accepted"] for s in range(100))
    assert accepted > 15
