"""What only some kinds can do: capabilities, asked for by capability and never by a kind's name.

A kind's module gives its ``Kind`` subclass a capability by deriving from its
class here too and implementing its one method. The CLI, the server,
distillation and ``sedd.runs`` ask through the functions below (or
``isinstance``), which refuse in one line naming the kinds that can.
"""

from __future__ import annotations

from typing import Any, Callable

from sedd import drafts, graphs, sampling
from sedd.kinds.base import Kind, Net, kinds_that


class Diffuses:
    """It samples by denoising steps (``sedd.sampling``'s samplers, `steps`) on a forward process.

    Attributes:
      graph: its forward graph (``sedd.graphs``).
      noise: its noise schedule (``sedd.noise``).
    """

    verb = "take denoising steps: it writes left to right"
    graph: graphs.Graph
    noise: Callable

    def one_token_steps(self, length: int) -> int:
        """The sampler steps that write one token a step over `length` positions (a block run's: per block)."""
        raise NotImplementedError


class Exact:
    """Its likelihood is the exact NLL, so it can judge samples (``sedd.figures.judge_nll``)."""

    verb = "judge samples: its likelihood is a bound, not the exact NLL"

    def sequence_nll(self, net: Net) -> Callable:
        """x int[B, L] -> -log p(x), float32[B] nats per sequence."""
        raise NotImplementedError


class ServesLanes:
    """``sedd serve`` runs it as a batch of lanes, each alone (``sedd.sampling.lanes``)."""

    verb = "be served lane by lane"

    def lane_program(
        self, graphdef, *, steps: int, sampler: str, trajectory: bool, live: bool
    ) -> sampling.lanes.LaneProgram:
        """The batched program, each lane's temperature and top_p traced; its weights are its first argument.
        trajectory: the frames along the way too; live: the states handed to the host at each call."""
        raise NotImplementedError


class Speculates:
    """It is decoded by speculative rounds (``sedd.speculative``), its law exactly."""

    verb = "decode by speculative rounds"

    def speculation(
        self, graphdef, draft=None, k: int | None = None, draft_name: str | None = None
    ) -> sampling.rounds.Speculation:
        """Its rounds. draft: None, "ngram" or another run's ``sedd.drafts.Drafter``; k: drafts a round (None:
        its default); draft_name: what the server reports. Raises a ValueError for a draft or k it cannot take."""
        raise NotImplementedError


class Drafts:
    """Its network drafts for a run that speculates."""

    verb = "draft for speculative sampling (the drafts: 'ngram', an AR run or a block-diffusion run)"

    def drafter(self, net: Net) -> drafts.Drafter:
        raise NotImplementedError


class Distills:
    """``sedd distill`` trains fewer steps into it (``sedd.sdtt``)."""

    verb = "be distilled: it has no denoising steps to distill"

    def noise_groups(self, model, train: bool = False, rngs=None) -> tuple[int, Callable]:
        """(b, fn): the network as groups of b positions sharing a noise level, fn(x_t, x0, sigma float[B, L / b])
        -> log-score float32[B, L, D]; dropout from rngs when train."""
        raise NotImplementedError


class Tunes:
    """Settings of its sampling are chosen by timing them on the device that samples (``sedd.kinds.layouts``).

    Attributes:
      layout: what its sampling runs when no layout is given: its default until ``tune`` sets the fastest here.
    """

    verb = "choose a round's layout"
    layout: Any

    def tune(self, net: Net, options: dict | None = None, workdir=None, batch: int = 1, progress: bool = False) -> str:
        """Set ``layout`` (the fastest here unless `options` name one; kept in workdir's layouts.json), every option
        of the sample checked first against the run; a line saying what was set (None: nothing to set)."""
        raise NotImplementedError


def check_given(kind: Kind, *, steps=None, sampler=None, patterns: tuple[str, ...] = ()) -> None:
    """Refuse an option given that `kind` cannot honour, in one line naming it and the kinds that take it: steps or
    a sampler (not None) for a kind that does not diffuse; a prompt pattern of `patterns` ("suffix", "infill")
    that is not in its conditions. ``Run.sample`` (so ``sedd sample``) and ``sedd serve`` ask it alike."""
    if not isinstance(kind, Diffuses):
        for name, value in (("steps", steps), ("sampler", sampler)):
            if value is not None:
                raise ValueError(
                    f"{name}={value!r}: a model.kind={kind.name!r} run writes left to right, with no denoising "
                    f"steps; {name} is for {kinds_that(lambda k: issubclass(k, Diffuses))}"
                )
    for name, what in (("suffix", "a suffix"), ("infill", "an infill template")):
        if name in patterns and name not in kind.conditions:
            raise ValueError(
                f"{what}: a model.kind={kind.name!r} run writes after a prompt only; {what} "
                f"is for {kinds_that(lambda k: name in k.conditions)}"
            )


def able(kind: Kind, capability: type, what: str) -> Any:
    """`kind` when it has `capability`; otherwise a ValueError in one line naming `what`, what the kind cannot
    do (the capability's verb) and the kinds that can."""
    if isinstance(kind, capability):
        return kind
    can = kinds_that(lambda k: issubclass(k, capability))
    raise ValueError(f"{what}: a model.kind={kind.name!r} run cannot {capability.verb}; {can} can")


def speculation(kind: Kind, graphdef, draft=None, k: int | None = None, draft_name: str | None = None):
    """``Speculates.speculation`` of a kind that speculates; None for any other, which takes no draft or k."""
    if isinstance(kind, Speculates):
        return kind.speculation(graphdef, draft, k, draft_name)
    if draft is not None or k is not None:
        able(kind, Speculates, "a draft (--draft)" if draft is not None else f"draft_k={k!r}")
    return None


def drafter(kind: Kind, net: Net) -> drafts.Drafter:
    """``Drafts.drafter`` of a kind whose network drafts; a ValueError for any other."""
    return able(kind, Drafts, "--draft RUN").drafter(net)


def refuse_drafts(kind: Kind, options: dict) -> None:
    """Pop draft and draft_k from a sample's options of a kind that does not speculate; refuse them if given."""
    speculation(kind, None, options.pop("draft", None), options.pop("draft_k", None))


def tune(kind: Kind, net: Net, options: dict, workdir=None, batch: int = 1, progress: bool = False) -> str | None:
    """``Tunes.tune`` of a kind that tunes; None for any other, which takes no layout."""
    if isinstance(kind, Tunes):
        return kind.tune(net, options, workdir, batch, progress)
    if options.get("layout") is not None:
        able(kind, Tunes, f"--layout {options['layout']}")
    return None
