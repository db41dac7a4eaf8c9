"""Text generation: sampling with a key/value cache (``TinyTransformer.decode``).

    ids = generate(model, prompt_ids, 50, temperature=0.8, top_k=40, generator=torch.Generator().manual_seed(0))

The prompt is encoded once (a "prefill" filling the caches); each new token then costs one position
through the model. A model sees at most ``max_seq_len`` positions, so every prediction conditions on
the last ``max_seq_len`` tokens at most, as nanoGPT's generate crops its input: past that the window
slides and the caches are filled again from it for every token (positions start at the window's
first token), which costs what a full recomputation (``use_cache=False``) costs.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from evo_attention.util.errors import UserError


def check_sampling(temperature: float, top_k: int | None, vocab_size: int) -> None:
    """UserError for a temperature that is not a finite number >= 0 or a top_k outside 1..vocab."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not math.isfinite(temperature) or temperature < 0:
        raise UserError(f"temperature must be a finite number >= 0 (0: always the most likely token), got "
                        f"{temperature!r}", setting="temperature")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= vocab_size):
        raise UserError(f"top_k must be an integer in 1..{vocab_size} (the vocabulary size), got {top_k!r}",
                        setting="top_k")


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           generator: torch.Generator | None = None) -> int:
    """One token id from the logits [vocab] of the next position: the arg max at temperature 0,
    else a draw from softmax(logits / temperature) restricted to the ``top_k`` most likely tokens."""
    logits = logits.float()
    if temperature == 0:
        return int(logits.argmax())
    # shifted to <= 0 and divided in float64 (where a temperature down to 5e-324 is not 0): a tiny
    # temperature sends every token but the most likely to -inf, never to inf or 0 / 0
    logits = ((logits - logits.max()).double() / temperature).float()
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate(model, prompt: Sequence[int], max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True, on_token: Callable[[int], None] | None = None) -> list[int]:
    """The ``max_new_tokens`` token ids that follow ``prompt`` (ids), sampled one at a time (see
    the module docstring). ``use_cache=False`` recomputes the whole window for every token;
    ``on_token`` is called with each new id as soon as it is sampled (to stream the text)."""
    if not len(prompt):
        raise UserError("the prompt is empty: give at least one token", setting="prompt")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise UserError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}",
                        setting="max_new_tokens")
    check_sampling(temperature, top_k, model.spec.vocab_size)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    window = model.spec.max_seq_len
    tokens = [int(i) for i in prompt]
    caches, fed = None, 0  # the caches hold the keys and values of tokens[:fed]
    try:
        for _ in range(max_new_tokens):
            if not use_cache:
                logits = model(torch.tensor([tokens[-window:]], device=device))[0, -1]
            else:
                if caches is None or len(tokens) > window:  # the window slides: refill the caches from it
                    caches, fed = model.new_caches(), max(0, len(tokens) - window)
                logits = model.decode(torch.tensor([tokens[fed:]], device=device), caches)[0, -1]
                fed = len(tokens)
            token = sample(logits, temperature, top_k, generator)
            tokens.append(token)
            if on_token is not None:
                on_token(token)
    finally:
        model.train(was_training)
    return tokens[len(prompt):]
