"""What if TorchRL's training segments started from other states? TorchRL's adapter of the what-if engine
(``lstm_probe/measure/whatif.py``, whose docstring says what is measured; ``probe(..., what_if=True, loss=...,
optimizer=...)`` with ``TorchRLProbe.measure_batch`` before each loss call, ``lstm-probe run --framework torchrl
--what-if``).

What it relies on (torchrl 0.14), cited by file:function:

- ``modules/tensordict_module/rnn.py:LSTMModule.forward`` (``GRUModule.forward`` alike): in recurrent mode a
  (B, T) batch is split where ``is_init`` is set after a row's first step (``_split_and_pad_for_reset``, or the
  "scan" backend's ``_lstm_scan_with_resets``: the same segments), and each segment starts from the state stored
  at its first step (``LSTMModule._lstm``: ``hidden0_in[..., 0, :, :]``; recurrent mode never zeroes it). The
  state keys are the module's ``in_keys`` between the input and ``is_init`` (h, c; or h). So the sequences are
  those segments: each row's first step and every ``is_init`` step after it, and an alternative's initial
  states go into a copy of the batch at the segments' first steps. A segment starts at the batch's first step
  or at an episode start, whose stored state is the primer's zero (``envs/transforms:TensorDictPrimer``
  resets it), so stored states are refreshed states: what can differ is the state carried into the batch
  (``zero``) and a shorter history (burn-ins, clipped at the batch start).
- ``objectives/ppo.py:ClipPPOLoss.forward``: the loss terms (``loss_objective``; ``loss_critic`` =
  ``critic_coeff`` times the critic's distance, ``PPOLoss.loss_critic``; ``loss_entropy`` =
  ``-entropy_coeff * entropy``; ``clip_fraction``), each from the batch's tensordict (the advantage as the
  value estimator left it, normalized inside when ``normalize_advantage``). The total the user steps with is
  taken as the sum of the ``loss_*`` terms, as ``run``'s loop and TorchRL's examples do. Per-element values
  and log-probabilities are the ones the loss computes (``PPOLoss._get_cur_log_prob``: the actor's
  ``get_dist``; ``PPOLoss.loss_critic``: the critic's ``tensor_keys.value``), computed once more (the loss
  returns means only), every alternative in one pass (the batches' rows joined: each row's segments apart).

Everything runs on a private copy of the loss module (``measure/copies.py``), run non-functional (its actor and
critic with their own parameters: TensorDict's deepcopy clones the functional parameters apart, which would
untie an LSTMModule the actor and critic share), weights copied in from the user's loss before each measured
minibatch. The batch is the collector's (``(envs, steps)``, or ``(steps,)`` for one env) holding each recurrent
module's input key (the observation where the module reads it); the minibatch is the whole batch. With
``separate_losses=True`` and a module the actor and critic share, the gradient comparison is left out (the copy's
critic loss would reach the shared module, the user's does not).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.errors import BadInput
from lstm_probe.integrations.torchrl.shadow import inner_rnn, shadow
from lstm_probe.measure import copies
from lstm_probe.measure import whatif as engine
from lstm_probe.measure.whatif import BURN_IN, Outcome, Rollout, States
from lstm_probe.options import Measure

ROLES = ("actor", "critic")


def settings(measure: Measure) -> dict[str, Any] | None:
    """The settings of :class:`WhatIf` (None when ``--what-if`` is off)."""
    if not measure.what_if:
        return None
    return {"every": measure.what_if_every, "burn_in": tuple(sorted(set(BURN_IN) | set(measure.burn_in)))}


def recurrent(net: nn.Module | None) -> list[nn.Module]:
    """The ``LSTMModule``/``GRUModule`` objects in ``net``, in module order, each once."""
    from torchrl.modules import GRUModule, LSTMModule

    found: dict[int, nn.Module] = {}
    for m in net.modules() if net is not None else ():
        if isinstance(m, LSTMModule | GRUModule):
            found.setdefault(id(m), m)
    return list(found.values())


def as_rows(data: Any) -> Any:
    """The batch as (rows, steps): the collector's (envs, steps), or (steps,) for one env."""
    if data.ndim == 1:
        return data.unsqueeze(0)
    if data.ndim != 2:
        raise BadInput(
            f"what-if and memory on TorchRL take the collector's batch, (envs, steps); got {tuple(data.shape)}"
        )
    return data


def refused(loss: Any) -> str | None:
    """Why what-if and memory cannot measure a run whose loss is ``loss`` (None: they can, or no loss known): they
    re-run a copy of a ``ClipPPOLoss`` (:class:`Copy`)."""
    from torchrl.objectives import ClipPPOLoss

    if loss is None or isinstance(loss, ClipPPOLoss):
        return None
    return f"what-if and memory on TorchRL re-run a ClipPPOLoss; this run's loss is {type(loss).__name__}"


class Copy:
    """A private copy of the user's ``ClipPPOLoss`` (its actor and critic), run non-functional, and what the
    adapters read of it: the recurrent module of each role (``actor``; ``critic`` where the critic has its own),
    their state keys, a sequence-first ``nn.LSTM``/``nn.GRU`` on each one's weights, and the copy's parameters
    beside the user's (those its optimizer steps)."""

    def __init__(self, loss: Any, traced: dict[str, Any] | None = None):
        from torchrl.objectives import ClipPPOLoss

        if not isinstance(loss, ClipPPOLoss):
            raise BadInput(f"what-if and memory on TorchRL re-run a ClipPPOLoss, not {type(loss).__name__}")
        if getattr(loss, "delay_actor", False):
            raise BadInput("what-if on TorchRL does not follow ClipPPOLoss(delay_actor=True); run without it")
        self.user = loss
        self.loss = copies.private_copy(loss)
        self.loss._functional = False  # its modules' own parameters (see the module's docstring)
        nets = {"actor": self.loss.actor_network, "critic": self.loss.critic_network}
        actor, critic = recurrent(nets["actor"]), recurrent(nets["critic"])
        if len(actor) != 1 or len(critic) > 1:
            raise BadInput("what-if and memory on TorchRL take an actor with one LSTMModule/GRUModule (a critic: one)")
        self.modules: dict[str, Any] = {"actor": actor[0]}
        self.critic = "mlp" if not critic else ("shared" if critic[0] is actor[0] else "lstm")
        if self.critic == "lstm":
            self.modules["critic"] = critic[0]
        self.value_modules = {"lstm": ["critic"], "shared": ["actor"], "mlp": []}[self.critic]
        # each role's module by the name the probe traces it under (``traced``: name -> the user's module, which
        # the user's loss holds): the report names the what-if's and memory's modules as its other sections do
        by_id = {id(m): name for name, m in (traced or {}).items()}
        users = {"actor": recurrent(loss.actor_network), "critic": recurrent(loss.critic_network)}
        self.names = {r: by_id[id(users[r][0])] for r in ("actor", "critic") if users[r] and id(users[r][0]) in by_id}
        # separate_losses: the user's critic loss leaves a shared module alone (PPOLoss.__init__ hands the critic
        # detached copies of the actor's parameters), the non-functional copy's would not: no gradient comparison
        self.same_gradient = not (getattr(loss, "separate_losses", False) and self.critic == "shared")
        self.rnns = {r: shadow(inner_rnn(m), batch_first=False) for r, m in self.modules.items()}
        keys = {r: list(m.in_keys) for r, m in self.modules.items()}
        self.input_key = {r: k[0] for r, k in keys.items()}
        self.state_keys = {r: k[1:-1] for r, k in keys.items()}
        self.is_init_key = keys["actor"][-1]
        if self.critic == "lstm" and set(self.state_keys["actor"]) & set(self.state_keys["critic"]):
            raise BadInput("what-if on TorchRL needs the actor's and critic's LSTMModules to keep their states apart")
        theirs = dict(loss.named_parameters()) | dict(loss.named_buffers())
        mine = nn.ModuleList([n for n in nets.values() if n is not None])
        names = ["actor_network", "critic_network"]
        self.params: list[tuple[torch.Tensor, torch.Tensor, bool]] = []  # (copy's, user's, value side)
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for kind, items in (("p", mine.named_parameters()), ("b", mine.named_buffers())):
            for n, p in items:
                i, rest = n.split(".", 1)
                net = names[int(i)]
                user = theirs.get(f"{net}_params.{rest}", theirs.get(f"{net}.{rest}"))
                if user is None:
                    if kind == "p":
                        raise BadInput(f"the loss module holds no parameter {net}.{rest}: its copy cannot follow it")
                    continue
                self.pairs.append((p, user))
                if kind == "p" and p.requires_grad:
                    self.params.append((p, user, net == "critic_network"))
        own = dict(self.loss.named_buffers(recurse=False))  # the coefficients (entropy_coeff, ...)
        self.pairs += [(b, theirs[n]) for n, b in own.items() if n in theirs]
        self._sampled: bool | None = None

    def sampled(self, td: Any) -> bool:
        """Whether the loss's gradient is a sampled estimate (found on the first batch measured): an entropy bonus
        of a distribution without a finite analytic entropy, which ``ClipPPOLoss._get_entropy`` estimates from
        ``samples_mc_entropy`` draws (run's TanhNormal on a Box)."""
        if self._sampled is None:
            from torchrl.modules import set_recurrent_mode

            with torch.no_grad(), set_recurrent_mode(True):
                dist = self.loss.actor_network.get_dist(td.clone(False))
                try:
                    analytic = bool(dist.entropy().isfinite().all())
                except NotImplementedError:
                    analytic = False
            self._sampled = bool(getattr(self.loss, "entropy_bonus", True)) and not analytic
        return self._sampled

    def sync(self, train: bool) -> None:
        """The user's current values into the copy; train or eval mode."""
        copies.sync(self.pairs)
        self.loss.train(train)


def flat_dist(dist: Any, n: int, index: Any = None) -> list[Any] | None:
    """The action distribution over the batch's ``n`` elements, flattened (optionally those at ``index``), as a
    list of one torch distribution; None for a kind this does not flatten (KL not measured).

    A bijective transform of a Normal (TorchRL's ``TanhNormal`` on a Box's bounds: tanh, then an affine map)
    flattens to its base Normal: the KL divergence is invariant under a bijection applied to both distributions,
    and both sides of every comparison here come from the same actor, so from the same transform."""
    if isinstance(dist, torch.distributions.TransformedDistribution):
        if not all(getattr(t, "bijective", False) for t in dist.transforms):
            return None
        dist = dist.base_dist
    d = dist.base_dist if isinstance(dist, torch.distributions.Independent) else dist
    if isinstance(d, torch.distributions.Categorical):  # torchrl's OneHotCategorical, MaskedCategorical too
        logits = d.logits.reshape(n, -1)
        return [torch.distributions.Categorical(logits=logits if index is None else logits[index])]
    if type(d) is torch.distributions.Normal:
        loc, scale = d.loc.reshape(n, -1), d.scale.reshape(n, -1)
        return [torch.distributions.Normal(*((loc, scale) if index is None else (loc[index], scale[index])))]
    return None


class WhatIf:
    """The what-if measurement of a TorchRL run: :meth:`on_batch` before the loss is computed on a batch; the
    engine's ``step_hook`` goes on the user's optimizer; :meth:`metadata` is what the log keeps under
    ``what_if``. ``epochs``, ``minibatches``: how many of each the loop runs per collected batch."""

    def __init__(
        self, copy: Copy, *, epochs: int, minibatches: int = 1, every: int, burn_in: Any = BURN_IN, gradient: bool
    ):
        self.copy = copy
        params = copy.params if gradient and copy.same_gradient else []
        self.engine = engine.WhatIf(
            every=every,
            burn_in=burn_in,
            n_minibatches=minibatches,
            last_epoch=epochs - 1,
            modules=list(copy.modules),
            critic=copy.critic,
            params=[p for p, _, _ in params],
            user_params=[u for _, u, _ in params],
            value_side=[v for _, _, v in params],
        )
        self.step_hook = self.engine.step_hook

    def metadata(self) -> dict[str, Any]:
        """The log's ``what_if``, with each role's traced module name (``module_names``)."""
        return self.engine.metadata() | {"module_names": dict(self.copy.names)}

    def on_batch(self, data: Any, where: tuple[int, int, int]) -> None:
        """Called before the loss of every (epoch, minibatch): measures it if sampled. ``data``: the batch the
        loss is called with (the collector's, GAE's advantage in it)."""
        if not self.engine.wants(*where):
            self.engine.skip()
            return
        c = self.copy
        c.sync(c.user.training)
        td = as_rows(data)
        e, t = td.shape
        for key in {*c.input_key.values(), *[k for ks in c.state_keys.values() for k in ks]}:
            if key not in td.keys(True):
                raise BadInput(
                    f"what-if on TorchRL needs {key!r} in the batch (the recurrent module's input and states)"
                )
        is_init = td.get(c.is_init_key).reshape(e, t).cpu().numpy().astype(bool)  # once per measured minibatch
        starts = is_init.copy()
        starts[:, 0] = True  # LSTMModule.forward splits each row where is_init is set after its first step
        env, step = np.nonzero(starts)
        device = td.device if td.device is not None else td.get(c.is_init_key).device
        ie, it = torch.from_numpy(env).to(device), torch.from_numpy(step).to(device)
        stored = {r: tuple(td.get(k)[ie, it].transpose(0, 1).contiguous() for k in c.state_keys[r]) for r in c.modules}

        def features(rows: np.ndarray) -> dict[str, torch.Tensor]:
            index = torch.from_numpy(rows).to(device)
            return {r: td.get(c.input_key[r]).reshape(e * t, -1)[index] for r in c.modules}

        rollout = Rollout(
            iteration=where[0],
            n_envs=e,
            n_steps=t,
            episode_starts=is_init.reshape(-1),
            rnns=dict(c.rnns),
            stored={
                r: tuple(td.get(k).reshape(e * t, *td.get(k).shape[2:]) for k in c.state_keys[r]) for r in c.modules
            },
            features=features,
        )
        mini = engine.Minibatch(
            where=where,
            env=env,
            step=step,
            stored=stored,
            evaluate=lambda s: self._evaluate(td, ie, it, s),
            sampled=bool(self.engine.params) and c.sampled(td),
        )
        self.engine.measure(rollout, mini, td.get(c.loss.tensor_keys.value_target))

    def _evaluate(self, td: Any, ie: torch.Tensor, it: torch.Tensor, states: list[States]) -> Outcome:
        """``ClipPPOLoss.forward`` on the copy from each of ``states`` (put into a copy of the batch at the
        segments' first steps), and the per-element values and log-probabilities it computes."""
        from torchrl.modules import set_recurrent_mode

        c = self.copy
        loss, keys = c.loss, c.loss.tensor_keys
        batches = []
        terms: dict[str, list[torch.Tensor]] = {k: [] for k in engine.TERMS}
        for alternative in states:
            x = td.clone(False)
            for role, given in alternative.items():
                for key, s in zip(c.state_keys[role], given, strict=True):
                    full = x.get(key).clone()
                    full[ie, it] = s.transpose(0, 1).to(full.dtype)
                    x.set(key, full)
            batches.append(x)
            engine.reseed(ie.device)  # every alternative's loss draws alike (its entropy may be sampled)
            with set_recurrent_mode(True):
                out = loss(x)
            zero = torch.zeros((), device=out["loss_objective"].device)
            coeff = loss.critic_coeff if getattr(loss, "_has_critic", False) else 1.0
            total = sum((out[k] for k in out.keys() if isinstance(k, str) and k.startswith("loss_")), zero)
            for k, v in zip(
                engine.TERMS,
                (
                    out["loss_objective"],
                    out.get("loss_critic", zero) / coeff,
                    -out.get("entropy", zero),
                    out["clip_fraction"],
                    total,
                ),
                strict=True,
            ):
                terms[k].append(v)
        # per element, what the loss computed (it returns means only): every alternative in one pass, rows apart
        n, n_alt = td.numel(), len(states)
        with torch.no_grad(), set_recurrent_mode(True):
            joined: Any = torch.cat(batches, 0)
            dist = loss.actor_network.get_dist(joined.clone(False))
            log_probs = dist.log_prob(joined.get(keys.action)).reshape(n_alt, n)
            if loss.critic_network is not None:
                values = loss.critic_network(joined.clone(False)).get(keys.value).reshape(n_alt, n)
            else:
                values = torch.zeros_like(log_probs)
        dists = [flat_dist(dist, n_alt * n, slice(a * n, (a + 1) * n)) for a in range(n_alt)]
        mask_key = ("collector", "mask")
        mask = td.get(mask_key).reshape(-1).bool() if mask_key in td.keys(True) else None
        if mask is None:
            mask = torch.ones(n, dtype=torch.bool, device=values.device)
        returns = td.get(keys.value_target).reshape(-1)
        known = None if any(d is None for d in dists) else [d for d in dists if d is not None]
        return Outcome(
            values,
            log_probs,
            mask,
            {k: torch.stack(v) for k, v in terms.items()},
            known,
            returns,
        )
