"""CLI flags made from the options' declarations (``options.option`` fields), so a flag's type, default and
help are written once, where the option is declared: ``run``'s and ``arch``'s (:func:`run_flags`,
:func:`arch_flags`). Used by cli.py; prints nothing."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any

import typer

from lstm_probe import integrations
from lstm_probe.errors import BadInput
from lstm_probe.options import CaptureOptions, TrainOptions, flag

NAME_HELP = (
    "An ONNX file lstm-probe did not write: the graph's input or output playing ROLE (obs, h, c, action, h_out, "
    "c_out, value) where its name is not the exporters' (obs, h_in, c_in, actions, h_out, c_out); repeat for each.  "
    "[default: by name]"
)
"""``replay --name``'s help (``deploy/foreign.py``)."""


@dataclasses.dataclass(frozen=True)
class Declared:
    """One CLI flag of a declared field: which group (dataclass) it fills, and its CLI default."""

    group: type[Any]
    field: dataclasses.Field[Any]
    parameter: inspect.Parameter

    @property
    def set_flag(self) -> str:
        """The flag as a user sets it away from its default (``--no-critic-lstm`` for a True default)."""
        info = self.parameter.annotation.__metadata__[0]  # typer.Option(*names): the first name is its default
        first = str(info.default).split("/")
        return first[1] if len(first) > 1 and self.field.default is True else first[0]


def declared(group: type[Any], prefix: str = "", only: Iterable[str] | None = None) -> list[Declared]:
    """The CLI flags of ``group``'s fields (those in ``only``, in that order, when given)."""
    hints = typing.get_type_hints(group)
    fields = {f.name: f for f in dataclasses.fields(group) if not f.metadata.get("hidden")}
    out = []
    for name in fields if only is None else only:
        f = fields[name]
        cli_type, flags, help = flag(f, hints[f.name], prefix)
        # a repeatable flag's "none given" is None to click; the group turns it into its own empty value
        cli_default = None if isinstance(f.default, tuple) else f.default
        annotation = Annotated[cli_type, typer.Option(*flags, help=help)]  # type: ignore[valid-type]
        param = inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=cli_default, annotation=annotation)
        out.append(Declared(group, f, param))
    return out


def with_flags(func: Callable[..., Any], flags: list[Declared]) -> Callable[..., Any]:
    """``func`` (explicit parameters, then ``**declared``) with ``flags`` added to the signature typer reads."""
    sig = inspect.signature(func, eval_str=True)
    explicit = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    positional = [p for p in explicit if p.default is inspect.Parameter.empty]
    rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in explicit if p not in positional]
    params = [*positional, *(d.parameter for d in flags), *rest]
    func.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    func.__annotations__ = {p.name: p.annotation for p in params}
    return func


def split(flags: list[Declared], values: dict[str, Any], given: Iterable[str] = ()) -> dict[type[Any], dict[str, Any]]:
    """The values given on the command line, by group: those named in ``given`` (the flags the user typed,
    even at their default value) and any other away from its default; a flag left out is left out, so the
    group's own default applies."""
    typed = set(given)
    out: dict[type[Any], dict[str, Any]] = {}
    for d in flags:
        value = values[d.field.name]
        if isinstance(value, list | tuple) and not value:
            value = None  # a repeatable flag not given
        if d.field.name in typed or value != d.parameter.default:
            out.setdefault(d.group, {})[d.field.name] = value
    return out


def run_flags() -> list[Declared]:
    """Every flag of ``run`` that an option group declares: the capture and training settings, then each
    framework's own (``integrations.FRAMEWORKS``; a group several take, once), whose help says which
    frameworks take it (nothing where every framework does)."""

    flags = [*declared(CaptureOptions), *declared(TrainOptions)]
    seen = {d.field.name for d in flags}
    for fw in integrations.FRAMEWORKS.values():
        for _, group in integrations.group_classes(fw):
            for f in dataclasses.fields(group):  # an option several frameworks declare is one flag
                if f.name not in seen and not f.metadata.get("hidden"):
                    seen.add(f.name)
                    names = integrations.owners(f.name)
                    every = len(names) == len(integrations.FRAMEWORKS)
                    flags += declared(group, prefix="" if every else f"{', '.join(names)}: ", only=(f.name,))
    return flags


def arch_flags() -> list[Declared]:
    """The flags of ``arch`` that option groups declare (each framework's that apply to its arch); the help of
    one that only some frameworks' arch takes says which, as ``run``'s does."""
    from lstm_probe.integrations.rsl_rl.options import RslRl
    from lstm_probe.integrations.sb3.options import Build

    flags = declared(TrainOptions, only=("shared_lstm", "hidden_size"))  # every framework's arch takes these
    for group, names in ((Build, ("critic_lstm", "lstm_layers", "hyperparams")), (RslRl, ("rnn_type",))):
        for name in names:
            flags += declared(group, prefix=f"{', '.join(integrations.owners(name, 'arch'))}: ", only=(name,))
    return flags


def html_only(html: object, **picked: int | None) -> bool:
    """Whether ``report`` writes a page (``html``: its ``--html`` path, or None). Its ``--iteration``, ``--env``
    and ``--episode`` pick what the page draws: without ``--html`` they would be taken and ignored, so they are
    refused in one line."""
    given = [f"--{k}" for k, v in picked.items() if v is not None]
    if given and html is None:
        raise BadInput(
            f"{' and '.join(given)} pick{'s' if len(given) == 1 else ''} what --html draws; add --html FILE "
            "(the text and JSON reports cover every iteration, env and episode)"
        )
    return html is not None
