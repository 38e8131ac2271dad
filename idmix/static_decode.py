"""The whole model's one-token decode step on static buffers: eager, compiled, or a CUDA graph.

Every tensor the step reads or writes lives at a fixed address for the whole generation (the
model's caches, updated in place, and :class:`DecodeBuffers`), nothing in it reads a value on
the host, and sampling runs on the device: so the compiled step can be captured once as a CUDA
graph and replayed per token with no host work but the replay (``mode="graphed"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import sample_next

MODES = ("eager", "compiled", "graphed")
WARMUP_STEPS = 2  # compiled steps run before the capture (compiles, autotuning, workspaces)


@dataclass
class DecodeBuffers:
    """The step's state besides the model's caches; B rows, S mask columns, N new tokens.

    keys: (B, S) bool, True on the columns a query may attend to (real tokens);
    columns: (S,) 0..S-1; column: () the mask column of the token fed next;
    token: (B, 1) the token fed next; pos: (B, 1) its position;
    out: (B, N) the new tokens (pad once a row is done); count: (B,) tokens each row emitted;
    done: (B,) whether a row has emitted a stop token; index: () the next slot of out;
    stop: (n,) the stop token ids; pad: () the id fed and written after a row is done.
    """

    keys: torch.Tensor
    columns: torch.Tensor
    column: torch.Tensor
    token: torch.Tensor
    pos: torch.Tensor
    out: torch.Tensor
    count: torch.Tensor
    done: torch.Tensor
    index: torch.Tensor
    stop: torch.Tensor
    pad: torch.Tensor

    @classmethod
    def create(cls, keys, next_pos, max_new_tokens: int, stop_tokens, pad_id: int):
        """keys: (B, S) bool; next_pos: (B,) the position of each row's first new token."""
        B, S = keys.shape
        device = keys.device

        def scalar(value):
            return torch.tensor(value, dtype=torch.long, device=device)

        return cls(
            keys=keys,
            columns=torch.arange(S, device=device),
            column=scalar(S - max_new_tokens),
            token=torch.full((B, 1), pad_id, dtype=torch.long, device=device),
            pos=next_pos[:, None].clone(),
            out=torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device),
            count=torch.zeros(B, dtype=torch.long, device=device),
            done=torch.zeros(B, dtype=torch.bool, device=device),
            index=scalar(0),
            stop=torch.as_tensor(list(stop_tokens), dtype=torch.long, device=device),
            pad=scalar(pad_id),
        )


def emit(buf: DecodeBuffers, logits, temperature, top_k, top_p, generator=None) -> None:
    """Sample from logits (B, V) into the buffers, in place: the token, its slot of out, the
    counts and the done flags."""
    nxt = sample_next(logits, temperature, top_k, top_p, generator)
    nxt = torch.where(buf.done, buf.pad, nxt)
    buf.out.index_copy_(1, buf.index.view(1), nxt[:, None])
    buf.count.add_((~buf.done).long())
    buf.done.logical_or_(torch.isin(nxt, buf.stop))
    buf.token.copy_(nxt[:, None])
    buf.index.add_(1)


def step_logits(model, token, pos, keys, columns, column) -> torch.Tensor:
    """One token through the model (its caches advance in place): token, pos (B, 1); keys (B, S)
    bool; columns (S,) 0..S-1; column () the token's mask column -> logits (B, V)."""
    row = keys & (columns <= column)  # (B, S): causal, never to padding
    return model(token, mask=row[:, None], input_pos=pos)[:, -1]


def decode_step(model, buf: DecodeBuffers, temperature, top_k, top_p, generator=None) -> None:
    """Feed buf.token through the model (its caches advance in place) and emit the next one."""
    logits = step_logits(model, buf.token, buf.pos, buf.keys, buf.columns, buf.column)
    buf.pos.add_(1)
    buf.column.add_(1)
    emit(buf, logits, temperature, top_k, top_p, generator)


_compiled: dict = {}


def compiled(step):
    """step (decode_step or step_logits) under ``torch.compile(fullgraph=True, dynamic=False)``:
    one compile per (model, shapes, sampling settings), shared by every generation that meets
    them."""
    if step not in _compiled:
        _compiled[step] = torch.compile(step, fullgraph=True, dynamic=False)
    return _compiled[step]


class StepRunner:
    """Runs decode_step per token in one of MODES. "graphed" (CUDA): the compiled step replayed
    as a CUDA graph (``GraphReplay``). generator: used by "eager" only (the compiled step draws
    from the device's generator)."""

    def __init__(self, model, buf: DecodeBuffers, sampling: tuple, mode: str, generator=None):
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        if mode == "graphed" and buf.keys.device.type != "cuda":
            raise ValueError(f"mode: 'graphed' needs a CUDA model, got {buf.keys.device}")
        self.model, self.buf, self.sampling, self.mode = model, buf, sampling, mode
        self.generator = generator if mode == "eager" else None
        self.replay = GraphReplay(self._compiled) if mode == "graphed" else None

    def __call__(self) -> None:
        if self.mode == "eager":
            decode_step(self.model, self.buf, *self.sampling, self.generator)
        elif self.mode == "compiled":
            self._compiled()
        else:
            self.replay()

    def _compiled(self) -> None:
        compiled(decode_step)(self.model, self.buf, *self.sampling)


class GraphReplay:
    """fn (a compiled step on fixed buffers) per call: its first WARMUP_STEPS calls run on a side
    stream (compiles, autotuning, workspaces), then it is captured once as a CUDA graph, and
    every later call replays the graph. calls: how many calls so far."""

    def __init__(self, fn):
        self.fn, self.calls, self.graph = fn, 0, None

    def __call__(self) -> None:
        if self.calls < WARMUP_STEPS:
            on_side_stream(self.fn)
        else:
            if self.graph is None:
                self.graph = capture(self.fn)
            self.graph.replay()
        self.calls += 1


def on_side_stream(fn) -> None:
    """fn() on a side stream, ordered with the current one: how a CUDA graph's warm-up runs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)


def capture(fn) -> torch.cuda.CUDAGraph:
    """fn recorded as a CUDA graph (recording runs nothing: replay it to run it). Warm fn up
    first (``on_side_stream``): its compiles and workspaces cannot happen inside a capture."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph
