"""Framework integrations: each module tells the tracer core what a framework's LSTM calls are.

``sb3/`` (sb3-contrib RecurrentPPO: ``ProbeCallback``; ``sb3/run.py`` builds and trains, ``sb3/arch.py``
analyses a policy), ``rllib`` (Ray RLlib's new API stack), ``generic`` (any torch model, tagged by the
user: ``lstm_probe.trace``). Each meets the core's contract (``lstm_probe.contract.Integration``); the
core, the writer and the reader never import this package.

:data:`FRAMEWORKS` is what the CLI dispatches on (``--framework``): for each framework, the module that
offers ``run(env_id, out, *, options, train, ...)`` and ``arch(target, ...)``, and the groups of options
only it takes (dataclasses declared beside the integration, importable without the framework: the CLI
builds its flags from them).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lstm_probe.errors import BadInput

if TYPE_CHECKING:
    from lstm_probe.deploy.spec import Loader, Policy


def lazy_names(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's ``__getattr__`` that loads each name of ``table`` (name -> the package's module that
    defines it, relative) on first use and keeps it: importing an integration's package imports no
    framework (rllib/, rsl_rl/, torchrl/ each set ``__getattr__ = lazy_names(__name__, _LAZY)``)."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{table[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


@dataclass(frozen=True)
class Framework:
    """A framework the CLI can train and analyse (``lstm-probe run/arch --framework NAME``)."""

    name: str
    module: str
    """The module offering ``run(env_id, *, options, train, <groups>, command, progress) -> RunResult`` and
    ``arch(target, ...)``; imported when the framework is used."""
    groups: tuple[tuple[str, str], ...] = ()
    """The option groups only this framework's ``run`` takes: (keyword of ``run``, "module:Class" of a
    dataclass declared with ``options.option`` fields). The CLI makes a flag of each field and refuses one
    set for another framework."""
    refuses: tuple[str, ...] = ()
    """Options of its groups it does not take yet (a shared group's measurement it does not provide): the CLI
    refuses them as it refuses another framework's options, naming the frameworks that take them."""
    arch_options: tuple[str, ...] = ()
    """Keyword arguments of ``arch`` beyond ``shared_lstm`` and ``hidden_size``."""
    extra: str | None = None
    """The extra (``lstm_probe.extras``) that installs the framework; None: installed with lstm-probe."""
    parts_per_process: bool = False
    """Every process writes its own part files: the log is a directory (``--out`` ends in '/')."""
    title: str = ""
    """What it trains, as ``--framework``'s help names it."""
    docs: str = "README.md"
    """The page of the repository that documents it (tests/test_frameworks.py checks it exists)."""
    arch: bool = True
    """``lstm-probe arch --framework NAME`` is built for it (else refused in one line, naming those that are)."""
    live: str | None = None
    """The "module:function" giving the run's latest figures for the progress display (``iteration``, ...);
    None: the display shows steps, bytes and time only."""
    deploy: str | None = None
    """The "module:function" of its :data:`lstm_probe.deploy.spec.Loader` (a model, or a saved model's path, to
    the deploy layer's ``Policy``: ``lstm-probe export``, ``replay``); None: the deploy layer takes none of
    its models."""
    deploy_files: tuple[str, ...] = ()
    """The suffixes of the saved models its ``deploy`` loader reads ('.zip'): how :func:`deploy_policy` picks
    the framework of a path."""
    deploy_packages: tuple[str, ...] = ()
    """The packages whose objects its ``deploy`` loader takes ('sb3_contrib'): how :func:`deploy_policy` picks
    the framework of a model object (its class's top-level package)."""
    arch_flags: str | None = None
    """The "module:function" giving, for one of its checkpoints (a path, read as data), the ``arch`` flags that
    rebuild its recurrent layers (``--rnn-type gru --hidden-size 16 --lstm-layers 1``; '' where it cannot say):
    what ``arch``'s refusal of that checkpoint (:func:`refuse_checkpoint`) hands the user; None: the refusal
    names the flags without their values."""
    deploy_mark: str | None = None
    """Where several frameworks' loaders read one suffix (rsl_rl's and TorchRL's ``.pt``): the value of the
    checkpoint's top-level ``"lstm_probe"`` entry that marks its saved models (``deploy/saved.py``: ``MARK``);
    None: the framework of a checkpoint that names none."""


FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in (
        Framework(
            "sb3",
            "lstm_probe.integrations.sb3.commands",
            title="RecurrentPPO",
            groups=(
                ("build_options", "lstm_probe.integrations.sb3.options:Build"),
                ("placement", "lstm_probe.options:Placement"),
                ("measure", "lstm_probe.options:Measure"),
            ),
            arch_options=("critic_lstm", "lstm_layers", "hyperparams", "env_id", "trust_model", "dot", "svg", "png"),
            live="lstm_probe.integrations.sb3.metrics:live",
            deploy="lstm_probe.integrations.sb3.deployed:loader",
            deploy_files=(".zip",),
            deploy_packages=("sb3_contrib", "stable_baselines3"),
        ),
        Framework(
            "rllib",
            "lstm_probe.integrations.rllib.train",
            title="Ray RLlib PPO with use_lstm",
            docs="docs/rllib.md",
            groups=(
                ("rllib", "lstm_probe.integrations.rllib.options:Rllib"),
                ("measure", "lstm_probe.options:Measure"),
            ),
            refuses=("info_keys",),
            extra="rllib",
            parts_per_process=True,
            deploy="lstm_probe.integrations.rllib.deployed:loader",
            deploy_files=(".pt",),
            deploy_packages=("ray",),
            deploy_mark="rllib",
        ),
        Framework(
            "rsl_rl",
            "lstm_probe.integrations.rsl_rl.train",
            title="Isaac Lab's PPO",
            docs="docs/rsl_rl.md",
            arch_options=("rnn_type", "lstm_layers", "dot", "svg", "png"),
            groups=(
                ("rsl_rl", "lstm_probe.integrations.rsl_rl.options:RslRl"),
                ("placement", "lstm_probe.options:Placement"),
                ("measure", "lstm_probe.options:Measure"),
            ),
            extra="rsl-rl",
            refuses=("info_keys",),
            deploy="lstm_probe.integrations.rsl_rl.deployed:loader",
            arch_flags="lstm_probe.integrations.rsl_rl.versions:arch_flags",
            deploy_files=(".pt",),
            deploy_packages=("rsl_rl",),
        ),
        Framework(
            "torchrl",
            "lstm_probe.integrations.torchrl.train",
            title="LSTMModule",
            docs="docs/torchrl.md",
            groups=(("measure", "lstm_probe.options:Measure"),),
            refuses=("info_keys",),
            arch_options=("rnn_type", "lstm_layers", "dot", "svg", "png"),
            extra="torchrl",
            deploy="lstm_probe.integrations.torchrl.deployed:loader",
            deploy_files=(".pt",),
            deploy_packages=("torchrl", "tensordict"),
            deploy_mark="torchrl",
        ),
    )
}


def framework(name: str, command: str = "run") -> Framework:
    """The framework called ``name`` for ``command`` ('run' or 'arch'), or :class:`BadInput` listing the
    ones that take it."""
    if name not in FRAMEWORKS:
        raise BadInput(f"--framework must be {' or '.join(FRAMEWORKS)}, not {name!r}")
    fw = FRAMEWORKS[name]
    if command == "arch" and not fw.arch:
        takes = " or ".join(f.name for f in FRAMEWORKS.values() if f.arch)
        raise BadInput(f"lstm-probe arch --framework {name} is not built yet (arch takes --framework {takes})")
    return fw


def help_text(command: str) -> str:
    """``--framework``'s help for ``command`` ('run' or 'arch'), from the declarations."""
    if command == "arch":
        return " or ".join(f"{f.name} ({f.title})" for f in FRAMEWORKS.values() if f.arch) + "."
    named = [f"{f.name} ({f.title})" for f in FRAMEWORKS.values()]
    extras = ", ".join(f"{f.name} '.[{f.extra}]'" for f in FRAMEWORKS.values() if f.extra)
    return f"{', '.join(named[:-1])} or {named[-1]}; each but sb3 needs its extra: {extras}."


def load(fw: Framework) -> ModuleType:
    """The framework's module (its ``run`` and ``arch``); :class:`BadInput` with the install line when the
    framework is not installed (checked before the module is imported: some import it only inside ``run``)."""
    from lstm_probe.extras import missing, require

    if fw.extra is not None:
        require(fw.extra, f"--framework {fw.name}")
    try:
        return importlib.import_module(fw.module)
    except ModuleNotFoundError as exc:
        line = missing(exc.name, f"--framework {fw.name}")
        if line is None:
            raise
        raise BadInput(line) from None


def deploy_policy(model: Any, trust_model: bool, env_id: str | None = None) -> Policy:
    """The deploy layer's ``Policy`` of ``model`` (a model object or a saved model's path), from the
    :data:`~lstm_probe.deploy.spec.Loader` its framework's entry names: the deploy layer finds a framework's
    policy here, and imports no integration itself. The framework is the one whose ``deploy_files`` hold the
    path's suffix (of several, the one whose ``deploy_mark`` the checkpoint names: ``saved.mark``, read as data),
    or whose ``deploy_packages`` hold the object's class's package (an ``(actor, critic)`` pair's first); its
    extra must be installed."""
    import os

    from lstm_probe.extras import require

    takers = [f for f in FRAMEWORKS.values() if f.deploy]
    if isinstance(model, str | os.PathLike):
        suffix = os.path.splitext(os.fspath(model))[1].lower()
        found = [f for f in takers if suffix in f.deploy_files]
        what = f"saved model named {suffix}" if suffix else "saved model without a suffix"
        if len(found) > 1:  # rsl_rl's and TorchRL's .pt: told apart by the mark TorchRL's run writes
            from lstm_probe.deploy import saved

            fix = f"pass a model saved by `lstm-probe run --framework {' or '.join(f.name for f in found)}`"
            mark = saved.mark(model, fix)
            found = [f for f in found if f.deploy_mark == mark] or [f for f in found if f.deploy_mark is None]
    else:
        one = model[0] if isinstance(model, tuple) and model else model  # an (actor, critic) pair
        package = type(one).__module__.partition(".")[0]
        found = [f for f in takers if package in f.deploy_packages]
        what = type(model).__name__[:60]
    if not found:
        takes = "; ".join(f"{f.name}: {', '.join(f.deploy_files)} files" for f in takers)
        if isinstance(model, str | os.PathLike) and os.path.isdir(model):
            raise BadInput(f"{os.fspath(model)[:200]} is a directory; pass a saved model file ({takes})")
        if isinstance(model, str | os.PathLike) and suffix == ".onnx":
            raise BadInput(
                f"{os.fspath(model)[:200]} is already an exported file; pass the model.zip or .pt checkpoint it was "
                "exported from (replay takes the .onnx file itself as --policy)"
            )
        raise BadInput(f"export and replay take no {what} (they take {takes})")
    fw = found[0]
    assert fw.deploy is not None
    if fw.extra is not None:
        require(fw.extra, f"a {fw.name} model")
    loader: Loader = declared(fw.deploy)
    return dataclasses.replace(loader(model, trust_model, env_id), framework=fw.name)


CHECKPOINTS = (".pt", ".pth")
"""The suffixes of ``torch.save`` checkpoints (rsl_rl's ``model_*.pt``, TorchRL's and RLlib's saved models)."""


def refuse_checkpoint(target: str) -> None:
    """``lstm-probe arch`` builds a framework's policy from an env id (sb3's also reads a model.zip): a
    ``.pt`` checkpoint is refused in one line that says how to see its architecture, ``arch ENV_ID --framework
    NAME`` with the sizes the checkpoint holds. The framework is the one :func:`deploy_policy` would choose (the
    suffix, then the checkpoint's mark, read as data); a file none reads names rsl_rl's and TorchRL's."""
    import os

    if os.path.splitext(target)[1].lower() not in CHECKPOINTS or not os.path.isfile(target):
        return
    found = [f for f in FRAMEWORKS.values() if f.arch and ".pt" in f.deploy_files]
    flags = "--rnn-type, --hidden-size and --lstm-layers as the run had them"
    try:
        from lstm_probe.deploy import saved

        mark = saved.mark(target, "")
        found = [f for f in found if f.deploy_mark == mark] or found
        if len(found) == 1 and found[0].arch_flags is not None:
            flags = declared(found[0].arch_flags)(target) or flags
    except (BadInput, ImportError):  # not a checkpoint torch reads as data, or torch missing: the plain words
        pass
    names = " or ".join(f.name for f in found)
    raise BadInput(
        f"{target} is a checkpoint of {names}, which arch does not read: arch builds the policy from the env id the "
        f"run trained on, `lstm-probe arch ENV_ID --framework {found[0].name if len(found) == 1 else 'NAME'} "
        f"{flags}` (export reads the checkpoint itself)"
    )


def declared(where: str | None) -> Any:
    """The object a declaration names as "module:name" (None for None), imported now."""
    if where is None:
        return None
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def group_classes(fw: Framework) -> list[tuple[str, type[Any]]]:
    """``fw``'s option groups as (keyword of its ``run``, dataclass)."""
    return [(keyword, declared(where)) for keyword, where in fw.groups]


def run_options(fw: Framework) -> set[str]:
    """The names of the options only ``fw``'s ``run`` takes."""
    return {f.name for _, cls in group_classes(fw) for f in dataclasses.fields(cls)} - set(fw.refuses)


def listed(names: list[str]) -> str:
    """``names`` as a sentence lists them: "sb3", "sb3 and rsl_rl", "sb3, rsl_rl and torchrl"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def owners(option: str, command: str = "run") -> list[str]:
    """The frameworks that take ``option`` in ``command`` ('run' or 'arch')."""
    return [f.name for f in FRAMEWORKS.values() if option in (run_options(f) if command == "run" else f.arch_options)]
