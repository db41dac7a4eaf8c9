"""``evo-attention generate``: continue a prompt with a saved model, one sampled token at a time
(a key/value cache where the attention allows one), and say how fast.

    evo-attention generate --model runs/quick/models/01 --prompt "k3 v7 k5" --max-new-tokens 20 --seed 0
"""

from __future__ import annotations

import sys
import time

from evo_attention.cli.common import load_with_plugins
from evo_attention.util.errors import UserError


def cmd_generate(args) -> int:
    import torch

    from evo_attention.data.tokenizers import encode_prompt
    from evo_attention.nn.decoding import check_sampling, generate
    from evo_attention.nn.program import InputCache, KernelState, KVCache
    from evo_attention.train.config import check_seed
    from evo_attention.train.environment import resolve_device
    from evo_attention.train.saving import load_model, load_tokenizer, saved_plugins

    if args.max_new_tokens < 0:
        raise UserError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    check_seed(args.seed)
    device = resolve_device(args.device)
    load_with_plugins(saved_plugins(args.model), args.plugin)  # its genes may use their ops and components
    model = load_model(args.model, device=str(device))
    check_sampling(args.temperature, args.top_k, model.spec.vocab_size)
    tokenizer = load_tokenizer(args.model)
    if tokenizer is None:
        raise UserError(f"{args.model} holds no tokenizer.json, so a text prompt cannot be read: save the model with "
                        "its data's vocabulary (search --keep-models and baseline --save-model do)")
    ids, unknown = encode_prompt(tokenizer, args.prompt)
    if unknown == len(ids):
        print(f"evo-attention: note: no word of the prompt is in the model's vocabulary: all {len(ids)} read as <unk>",
              file=sys.stderr)
    elif unknown:
        print(f"evo-attention: note: {unknown} of the prompt's {len(ids)} tokens are not in the model's vocabulary "
              "and read as <unk>", file=sys.stderr)
    generator = torch.Generator().manual_seed(args.seed)
    stream = TextStream(tokenizer, ids)
    start = time.perf_counter()
    try:  # the text appears as it is sampled; Ctrl-C keeps what was generated
        new = generate(model, ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                       generator=generator, on_token=stream.add)
    finally:
        stream.close()
    seconds = time.perf_counter() - start
    rate = f"{len(new) / seconds:,.1f} tokens/s" if seconds > 0 and new else "-"
    # how the layers decode (nn.program): cached keys and values, a kernel's running sums, or recomputation
    words = {KVCache: "key/value cache", KernelState: "running sums", InputCache: "recomputed per token"}
    how = " + ".join(dict.fromkeys(words[type(c)] for c in model.new_caches()))
    print(f"evo-attention: {len(new)} new tokens in {seconds:.2f}s ({rate}, {how}, {device}; "
          f"prompt {len(ids)} tokens, window {model.spec.max_seq_len})", file=sys.stderr)
    return 0


class TextStream:
    """Prints the prompt, then each sampled token's text as it comes (stdout, flushed). A token's text
    is what decoding the last few tokens adds; a token that ends in the middle of a character (a
    byte of a UTF-8 sequence) waits for the next one."""

    CONTEXT = 8  # tokens decoded before the new ones, so that spacing between tokens comes out right

    def __init__(self, tokenizer, prompt: list):
        self.tokenizer = tokenizer
        self.context = list(prompt)[-self.CONTEXT:]
        self.pending: list = []
        self._write(tokenizer.decode(list(prompt)))

    def _write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def add(self, token: int) -> None:
        self.pending.append(int(token))
        before = self.tokenizer.decode(self.context)
        after = self.tokenizer.decode(self.context + self.pending)
        if after.endswith("\ufffd") or not after.startswith(before):
            return  # half a character, or a decoding that rewrites its context: wait for more
        self._write(after[len(before):])
        self.context = (self.context + self.pending)[-self.CONTEXT:]
        self.pending = []

    def close(self) -> None:
        if self.pending:
            before = self.tokenizer.decode(self.context)
            after = self.tokenizer.decode(self.context + self.pending)
            self._write(after[len(before):] if after.startswith(before) else self.tokenizer.decode(self.pending))
            self.pending = []
        self._write("\n")


def register(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a saved model (sampling with a key/value cache)")
    p.add_argument("--model", metavar="DIR", required=True,
                   help="a saved model directory (search --keep-models, baseline --save-model)")
    p.add_argument("--prompt", required=True, help="the text to continue (words outside the vocabulary read as <unk>)")
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to generate (default 50)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature; 0 always takes the most likely token (default 1.0)")
    p.add_argument("--top-k", type=int, help="sample only among the K most likely tokens (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto")
    p.add_argument("--plugin", action="append", metavar="MODULE",
                   help="import this module or .py file first (repeatable): the plugins the model was trained with "
                        "are imported anyway; a file given here stands in for a saved one of the same name, or a "
                        "module named by its stem (a.b for b.py)")
    p.set_defaults(func=cmd_generate)
