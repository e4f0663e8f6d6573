r"""Speculative decoding lane by lane: what ``sedd serve`` runs for a model that writes left to right with drafts.

A ``Speculation`` is what a kind gives the server (``sedd.kinds.Kind.speculation``):
how to build, for one lane's traced temperature and top_p, the three parts
``sedd.speculative.decode`` takes (prefill, target, drafter), and the drafts a
round k. ``Speculation.program`` is its ``sedd.sampling.lanes.LaneProgram``:
each lane alone under ``map_lanes`` (its own key, temperature and top_p, one
compiled program for every value), its rounds those of
``sedd.speculative.run_rounds``, so the text has the target's law whatever the
drafts (Leviathan et al. 2023, Thm. 3.5).

A lane's prompt is the given positions at its start, and it writes up to the
next given position (or the end): a server marks the positions after a
completion as given, so that a lane stops where its completion ends. With
`live`, every round is handed to the host as it lands (``observe_rounds``):
the lane's drafts, how many were kept and the token written after them, which
``Rounds`` writes into each lane's text before handing both on.

Letters: B lanes, L length, k drafts a round, V vocabulary, T = L + k + 1 the text's buffer.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from sedd import speculative
import sedd.sampling.lanes as lanes_lib


@dataclasses.dataclass(frozen=True, eq=False)
class Speculation:
    """How a kind decodes speculatively, lane by lane.

    Attributes:
      parts: (temperature float32[], top_p float32[]) -> (prefill, target, drafter), called traced for one
        lane: target and drafter as ``sedd.speculative.decode`` takes them (target's law shaped by T and
        top_p, T = 0 its argmax); prefill(state, text int32[1, T]) -> (target_state, drafter_state), with
        `state` the program's first argument (``program_state``). prefill is given the lane's whole text
        buffer, the prompt followed by zeros, so target and drafter must read text[:, :start] only at
        each call (a KV cache rolled back to `start` does).
      k: drafts a round (0: none; each round writes the one token the target draws).
      draft: the drafter's name as the server reports it ("ngram", a run's name, "self"), or None.
      draft_calls: network calls the drafter makes a round (0 for n-grams, or for a model that drafts in
        the target's own call).
      draft_state: what prefill needs besides the target's (params, rest): a drafter network's; None.
      categorical: the method of the redraws (``sedd.categorical.sample_categorical``).
      shared: the drafter reads the target's state (one network drafting in the target's call,
        ``sedd.speculative.decode``'s shared); prefill's drafter_state is then unused.
      verification: "joint" or "token" (``sedd.speculative.round_law``).
    """

    parts: Callable
    k: int
    draft: str | None
    draft_calls: int = 0
    draft_state: Any = None
    categorical: str = "precise"
    shared: bool = False
    verification: str = "joint"

    def describe(self) -> dict:
        """What the server's model list says: {"draft": name, "draft_k": k}."""
        return {"draft": self.draft, "draft_k": self.k}

    def program_state(self, state: tuple) -> Any:
        """The program's first argument from the target's (params, rest); (state, draft_state) with a drafter net."""
        return state if self.draft_state is None else (state, self.draft_state)

    def program(self, graphdef=None, *, live: bool, **_) -> lanes_lib.LaneProgram:
        """The ``LaneProgram`` (``Kind.lane_program``'s arguments; only `live` applies: the network is in `parts`)."""
        static = {name: getattr(self, name) for name in ("parts", "k", "categorical", "shared", "verification")}
        return lanes_lib.LaneProgram(
            sample_lanes,
            {**static, "live": live},
            _no_frames,
            listen=Rounds,
            report=functools.partial(report, k=self.k, draft=self.draft, draft_calls=self.draft_calls),
        )


def _no_frames(*_):
    raise ValueError("a speculative program has rounds, not denoising frames")


def observe_rounds(batch_id: jax.Array, r, start, drafted, accepted, tokens, live) -> None:
    """Traced, under ``map_lanes``: hand one round of every lane of the batch to its listener (``Rounds``).

    Each argument is this lane's (batch of one, ``sedd.speculative.run_rounds``'s on_round); one callback
    a round for the whole batch, the lanes gathered over ``lanes.AXIS``.
    """
    gathered = [
        jax.lax.all_gather(a[0] if a.ndim else a, lanes_lib.AXIS)
        for a in (jnp.broadcast_to(r, start.shape), start, drafted, accepted, tokens, live.astype(jnp.int32))
    ]
    jax.debug.callback(lanes_lib.deliver, batch_id, *gathered)


@functools.partial(jax.jit, static_argnames=("parts", "k", "categorical", "live", "shared", "verification"))
def sample_lanes(
    state,
    seeds,
    lanes,
    mask,
    tokens,
    temperature,
    top_p,
    batch_id,
    *,
    parts,
    k,
    categorical,
    live,
    shared=False,
    verification="joint",
):
    """``LaneProgram.fn`` of speculative decoding: ``sedd.speculative.run_rounds`` per lane (``map_lanes``).

    Returns (ids int32[B, L], None, stats): stats["nfe"] and ["rounds"] int32[B] the target's calls
    of each lane, ["accepted_at"] int32[B, k] the rounds of each lane that kept the draft at position i.
    """
    length = mask.shape[1]
    pos = jnp.arange(length)

    def one(key, m, t, temp, p):  # (L,), (L,), (), ()
        prefill, target, drafter = parts(temp, p)
        given = jnp.sum(jnp.cumprod(m.astype(jnp.int32)))  # the prompt: the given positions at the start
        end = jnp.min(jnp.where(m & (pos >= given), pos, length))  # up to the next given position
        text = jnp.zeros((1, length + k + 1), jnp.int32).at[0, :length].set(jnp.where(pos < given, t, 0))
        t_state, d_state = prefill(state, text)
        on_round = functools.partial(observe_rounds, batch_id) if live else None
        text, _, rounds, accepted_at = speculative.run_rounds(
            key,
            t_state,
            d_state,
            text,
            given[None],
            end[None],
            target=target,
            drafter=drafter,
            k=k,
            categorical=categorical,
            on_round=on_round,
            shared=shared,
            verification=verification,
        )
        return text[0, :length], None, {"nfe": rounds[0], "rounds": rounds[0], "accepted_at": accepted_at[0]}

    return lanes_lib.map_lanes(one, seeds, lanes, mask, tokens, temperature, top_p)


def report(stats: dict, length: int, *, k: int, draft: str | None, draft_calls: int) -> dict:
    """The `speculative` object of a completion of n lanes: network calls, tokens a call, acceptance by position.

    Args:
      stats: the program's stats of the completion's lanes: "rounds" int[n], "accepted_at" int[n, k].
      length: the tokens each lane's completion holds.
    Returns:
      {"speculative": {...}}: target_calls (one a round; the prompt's prefill is not counted, as an AR
      baseline's is not), draft_calls, network_calls (their sum), tokens (n x length), tokens_per_call,
      tokens_per_target_call, accepted (drafts kept), acceptance_by_position (the share of rounds that
      kept the draft at position i, i < k: it falls with i, as a draft is kept only after those before it).
    """
    n = int(np.size(stats["rounds"]))
    rounds = int(np.sum(stats["rounds"]))
    accepted_at = np.asarray(stats["accepted_at"]).reshape(n, k).sum(0)  # (k,)
    tokens = n * int(length)
    calls = rounds * (1 + draft_calls)
    return {
        "speculative": {
            "draft": draft,
            "draft_k": k,
            "rounds": rounds,
            "target_calls": rounds,
            "draft_calls": rounds * draft_calls,
            "network_calls": calls,
            "tokens": tokens,
            "tokens_per_call": tokens / max(calls, 1),
            "tokens_per_target_call": tokens / max(rounds, 1),
            "accepted": int(accepted_at.sum()),
            "acceptance_by_position": [float(a) / max(rounds, 1) for a in accepted_at],
        }
    }


class Rounds:
    """The host end of a speculative batch: each lane's text as its rounds land, and the round, handed on.

    `listener(states int32[B, L], rounds)` is called once a round with the
    whole text of every lane (the prompt, the tokens written so far, `text`'s
    blank after) and rounds[b] = {"round", "start", "drafted", "accepted",
    "written"} for a lane that wrote this round (None for a lane already done):
    the drafts of positions start .. start + k - 1, how many were kept, and
    the token written after them (the redraw of the first rejected draft, or
    the extra token when all were kept).
    """

    def __init__(self, listener: Callable, text: np.ndarray):
        self.listener, self.text = listener, text

    def __call__(self, r, start, drafted, accepted, tokens, live) -> None:
        width, out = self.text.shape[1], []
        for b in range(len(start)):
            if not live[b]:
                out.append(None)
                continue
            s, a = int(start[b]), int(accepted[b])
            n = max(min(a + 1, width - s), 0)
            self.text[b, s : s + n] = tokens[b, :n]
            out.append(
                {
                    "round": int(r[b]),
                    "start": s,
                    "drafted": [int(y) for y in drafted[b]],
                    "accepted": a,
                    "written": int(tokens[b, a]),
                }
            )
        self.listener(self.text.copy(), out)
