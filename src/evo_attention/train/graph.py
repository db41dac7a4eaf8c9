"""One training step as a CUDA graph: the same kernels, replayed without launching them one by one.

A small model's training step on a GPU is bound by the host launching its ~1,250 operators one by one
(seed config, H100: 23.2 ms a step eager, 3.0 ms replayed; docs/results/gpu/graph-h100.json).

The contract (``Trainer`` holds a ``StepGraph`` where ``graph_problem`` finds none):

- What is captured: ``Trainer._graph_body``, the whole step of one model: forward pass, fused loss,
  backward pass, gradient clipping and PyTorch's fused AdamW (``optim.SingleAdamW.update``). Its
  inputs are static device tensors that each replay refills: the batch, the learning rate (the
  optimizer's rate is a device tensor: ``graphable``) and the counter stream's keys of the step's
  dropout calls (``nn.dropout_counter``: the keys of (seed, step, call), [calls, 2]); its losses come
  back in a static tensor, read before the next replay.
- When: after ``CAPTURE_AFTER`` eager steps (the FLOP count, then steps on the capture's side stream
  that create the optimizer's state and the libraries' workspaces). The steps before the capture are
  ordinary training steps, so no step is skipped or repeated.
- Same numbers: the replay runs the kernels the eager step runs, in the same order, on the same
  data (the autocast cache off: the same casts, recomputed). A capture that fails (an operator that
  waits for the host, say) leaves the training eager from that step on: another speed, the same
  result; the record says so (``cuda_graph``).
- Not graphed (``graph_problem``): anything but CUDA; K > 1 folded models (their optimizer takes
  per-model rates from the host each step); a compiled model; dropout masks drawn on the CPU
  (``dropout_stream: cpu`` with any dropout: use the counter stream); ``cuda_graph: off``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from evo_attention.nn.dropout_counter import keys_tensor

CAPTURE_AFTER = 3  # eager steps before the capture: the FLOP count, then two on the side stream


def graph_problem(setting: str, device: torch.device, models: int, compiled: bool) -> str | None:
    """Why a training cannot replay its step as a CUDA graph, known before it starts (None: it can,
    unless its first steps draw dropout masks on the CPU, or the capture fails)."""
    if setting == "off":
        return "cuda_graph off"
    if device.type != "cuda":
        return f"not on CUDA ({device.type})"
    if models > 1:
        return f"{models} models folded into one step"
    if compiled:
        return "the model is compiled"
    return None


class StepGraph:
    """One model's training step captured and replayed (module docstring). ``body(x, y)`` is the
    step on static inputs, returning the losses; ``capture`` records it, ``replay`` runs it again."""

    def __init__(self, device: torch.device, body: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 before_capture: Callable[[], None]):
        self.device, self.body, self.before_capture = device, body, before_capture
        self.stream = torch.cuda.Stream(device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.keys: torch.Tensor | None = None  # [calls, 2] int64: the counter stream's keys of the step
        self.calls = 0  # dropout calls in one step
        self.x = self.y = self.losses = None
        self.captured_at: int | None = None
        self.failure: str | None = None

    def warm(self, step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """An eager step on the capture's side stream (the warm-up PyTorch asks for before a capture)."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            losses = step()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return losses

    def capture(self, x: torch.Tensor, y: torch.Tensor, calls: int, at_step: int) -> bool:
        """Record the step for batches shaped like ``x``, ``y`` with ``calls`` dropout calls; False
        (and ``failure`` says why) if the capture failed: the training goes on eagerly."""
        self.x, self.y, self.calls = torch.empty_like(x), torch.empty_like(y), calls
        self.keys = torch.zeros(calls, 2, dtype=torch.int64, device=self.device) if calls else None
        graph = torch.cuda.CUDAGraph()
        self.before_capture()  # gradients None: the captured backward pass allocates (and rewrites) them
        try:
            with torch.cuda.graph(graph, stream=self.stream):
                self.losses = self.body(self.x, self.y)
        except Exception as exc:  # noqa: BLE001 - any failure to capture leaves the step eager
            # the first error: ending a capture an operator broke raises one that only says "a previous error"
            first = exc.__context__ if exc.__context__ is not None else exc
            self.failure = f"{type(first).__name__}: {str(first).splitlines()[0][:160] if str(first) else ''}"
            self.x = self.y = self.keys = self.losses = None
            self.before_capture()
            torch.cuda.synchronize(self.device)
            return False
        self.graph, self.captured_at = graph, at_step
        return True

    def replay(self, x: torch.Tensor, y: torch.Tensor, keys: list[tuple[int, int]]) -> torch.Tensor:
        """One step on ``x``, ``y`` with the counter keys ``keys`` (one per dropout call); the losses
        (a static tensor: read it before the next replay). The rate was set in the optimizer's tensor."""
        self.x.copy_(x, non_blocking=True)
        self.y.copy_(y, non_blocking=True)
        if self.keys is not None:
            keys_tensor(keys, self.device, out=self.keys)
        self.graph.replay()
        return self.losses

    def describe(self) -> str:
        if self.graph is not None:
            return f"captured at step {self.captured_at}"
        return f"capture failed ({self.failure})" if self.failure else "not captured"
