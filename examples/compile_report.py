"""The compile report for Hugging Face GPT-2 (a small random config): one forced graph break and one
recompile, written as one self-contained HTML page.

    python examples/compile_report.py [OUT.html]      (default: kiln_report_gpt2.html)

Open the page in a browser: the summary, compile time by stage, the graph break (kind, line, fix),
the recompile (the guard that failed, old and new values), the dynamic dims, and every kernel
with its C++, the aten ops and the user lines it came from.
"""
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import kiln


def next_token_probs(model, ids):
    logits = model(ids).logits
    print(f"logits {tuple(logits.shape)}")  # a forced graph break: print runs between two graphs
    return logits[:, -1].softmax(-1)


def main(out="kiln_report_gpt2.html"):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)
    model = GPT2LMHeadModel(config).eval()
    compiled = kiln.compile(next_token_probs)
    with torch.no_grad(), kiln.report(out) as data:
        for length in (16, 24):  # the second length fails a size guard: a recompile, then dynamic
            ids = torch.randint(0, config.vocab_size, (2, length))
            torch.testing.assert_close(compiled(model, ids), next_token_probs(model, ids), rtol=1e-4, atol=1e-5)
    print(f"{out}: {len(data.frames)} frames, {len(data.graphs)} graphs, {len(data.graph_breaks)} break(s), "
          f"{len(data.recompiles)} recompile(s), {len(data.kernels)} kernels")


if __name__ == "__main__":
    main(*sys.argv[1:])
