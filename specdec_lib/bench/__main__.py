"""`python -m specdec_lib.bench ...`: the benchmark CLI (bench/harness.py)."""
from .harness import main

main()
