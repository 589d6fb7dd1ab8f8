"""Where FAFO and CARD spend their time on a GPU: one prompt, growing token counts, a stack dump every 40 s."""
import faulthandler, sys, time
import torch
faulthandler.dump_traceback_later(40, repeat=True, file=sys.stdout)
from specdec_lib.models import load_models
from specdec_lib.decoding import generate
from specdec_lib.bench.harness import load_suite

DEV = "cuda" if torch.cuda.is_available() else "cpu"
method = sys.argv[1]
extra = dict(a.split("=", 1) for a in sys.argv[2:])
extra = {k: (int(v) if v.isdigit() else v) for k, v in extra.items()}
pair = load_models("tiny", device=DEV)
prompt = load_suite("code", limit=1)[0]
ids = torch.tensor([pair.tokenizer(prompt["prompt"] if isinstance(prompt, dict) else prompt)["input_ids"]], device=DEV)
want = generate("autoregressive", pair.target, ids, 64).new_tokens
for n in (8, 16, 32, 64, 64):
    t0 = time.perf_counter()
    r = generate(method, pair.target, ids, n, draft=pair.draft, **extra)
    torch.cuda.synchronize() if DEV == "cuda" else None
    print(f"[diag] {method} {extra} {n} tokens: {time.perf_counter() - t0:.1f} s, MAT {r.mat:.2f}, "
          f"match {r.new_tokens == want[:n]}", flush=True)
