"""The user-facing pipeline: compile() for training loops, and run_workload() for the CLI.

compile() captures the iteration, profiles it on the memory system, plans it for the
budget and returns a step function that trains with the plan, iteration after iteration.
The model's parameters and the optimizer's state are kept current: tensors in fast memory
are shared with the model (no copies), and anything the plan keeps in slow memory is
written back before `model.state_dict()` or `step.sync()`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable

import torch

from .frontend.capture import capture
from .frontend.grad_clipping import GradClip
from .errors import SessionFailed, StateChanged
from .runtime.report import RunReport
from .runtime.session import ExecutorSession
from .frontend.optim_lowering import live_groups
from .planner import plan as make_plan
from .interpret.replay import TrainingState, check_batch
from .tiers import MemorySystem, SlowHandle, make_memory_system


# progress(stage, done, total, what): stage is "capture", "profile", "plan" or "session";
# done/total count the profile's measurements (0, 0 elsewhere)
CompileProgress = Callable[[str, int, int, str], None]

# the default solver time limit of compile (seconds, the whole plan call): small, as a
# training script waits for it; the CLI's plan/run keep 60 s (--time-limit)
COMPILE_TIME_LIMIT = 10.0
# and its default gap: a plan proven within 2 % of the best plan any time limit could find
# (issue 33's target against a 10-minute solve) is where waiting longer stops paying; the
# planner's own default (1 %) kept proving plans it had already found
COMPILE_MIP_GAP = 0.02


class _StderrProgress:
    """compile(progress=True): one line on stderr per stage, rewritten at most every 0.5 s."""

    def __init__(self):
        self.stage, self.t_stage, self.t_line = None, 0.0, 0.0

    def __call__(self, stage: str, done: int, total: int, what: str) -> None:
        now = time.perf_counter()
        if stage != self.stage:
            if self.stage is not None:
                sys.stderr.write(f"\rautotm: {self.stage} done in {now - self.t_stage:.1f} s\033[K\n")
            self.stage, self.t_stage, self.t_line = stage, now, 0.0
        if now - self.t_line < 0.5 and stage != "done":
            return
        self.t_line = now
        if stage == "done":
            return
        count = f" {done}/{total}" if total else ""
        sys.stderr.write(f"\rautotm: {stage}{count} {what} ({now - self.t_stage:.0f} s)\033[K")
        sys.stderr.flush()


class CompiledStep:
    """`loss = step(x, y)`: one training iteration following the plan.

    `stage_seconds`: wall seconds of "capture", "profile", "plan" and "session" (the
    executor's set-up); `profile_stats`: the profile's ProfileStats.

    Between steps the model and optimizer stay the user's (docs: README "What autotm
    guarantees"): hyperparameters are read at every step; `load_state_dict` on either,
    in-place edits and replaced tensors are taken into the next step, as eager would take
    them; a change the compiled iteration cannot follow (train/eval, requires_grad, an
    optimizer flag) makes the next step raise StateChanged naming it. A failed or
    interrupted step leaves the model and optimizer at the last completed step, or, when it
    failed after it began overwriting them, makes their state_dict() raise until a
    checkpoint is loaded.
    """

    def __init__(self, model: torch.nn.Module, loss_fn, optimizer: torch.optim.Optimizer, example_batch, *,
                 memory: str | MemorySystem = "cpu+file", budget: Any = None, formulation: str = "asynchronous",
                 cache=None, slow_dir: str | None = None, progress: bool | CompileProgress | None = None,
                 clip_grad_norm: float | None = None, clip_norm_type: float = 2.0,
                 clip_grad_value: float | None = None, **plan_options):
        from .profile.profiler import profile
        from .runtime.overhead import measure_executor_overhead

        report = _StderrProgress() if progress is True else (progress or None)
        self.stage_seconds: dict[str, float] = {}
        self.profile_stats = None
        t = [time.perf_counter()]

        def stage(name: str, what: str = "") -> None:
            if report is not None:
                report(name, 0, 0, what)

        def finished(name: str) -> None:
            now = time.perf_counter()
            self.stage_seconds[name] = now - t[0]
            t[0] = now

        self.model, self.optimizer = model, optimizer
        self.memory = None
        self.session = None
        self._closed = False
        self._lost: str | None = None  # why the model's state is no step's state (a failed step)
        self._hooks: list = []
        # the profile draws random operands and calibrates with a fixed seed: the caller's
        # RNG stream goes on after compile as if compile had not run
        with torch.random.fork_rng(devices=[]):
            stage("capture", type(model).__name__)
            clip = None
            if clip_grad_norm is not None or clip_grad_value is not None:
                clip = GradClip(max_norm=clip_grad_norm, norm_type=clip_norm_type, clip_value=clip_grad_value)
            self.graph = capture(model, loss_fn, optimizer, tuple(example_batch), name=type(model).__name__,
                                 clip=clip)
            finished("capture")
            self._owned = isinstance(memory, str)
            self.memory = make_memory_system(memory, slow_dir=slow_dir) if isinstance(memory, str) else memory
            plan_options.setdefault("time_limit", COMPILE_TIME_LIMIT)
            plan_options.setdefault("mip_gap", COMPILE_MIP_GAP)
            try:
                if not plan_options.get("pin_params"):
                    # an infeasible budget fails now, before the minutes of the profile
                    from .planner.floor import check_before_profile

                    check_before_profile(self.graph, budget, formulation, self.memory.access)
                inputs = TrainingState(self.graph, model, optimizer).inputs(tuple(example_batch))
                stage("profile", f"{len(self.graph.kernels)} kernels on {self.memory.name}")
                self.cost_model, self.profile_stats = profile(
                    self.graph, self.memory, cache, inputs=inputs, return_stats=True,
                    measure_overhead=measure_executor_overhead,
                    progress=None if report is None else lambda d, n, w: report("profile", d, n, w))
                del inputs
                finished("profile")
                stage("plan", f"{formulation}, time limit {plan_options['time_limit']:g} s")
                self.plan = make_plan(self.graph, self.cost_model, budget, formulation, **plan_options)
                finished("plan")
                stage("session")
                self._open_session()
                finished("session")
                stage("done")
            except BaseException:
                self.close()
                raise
        self._group_params = [tuple(id(p) for p in g["params"]) for g in optimizer.param_groups]
        self._modes = {name: m.training for name, m in model.named_modules()}
        self._requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
        self._steps_done = 0
        self._synced = False  # the model holds copies of the slow values, current since the last step
        self._model_loaded = False  # model.load_state_dict since the last step
        self._hooks = [model.register_state_dict_pre_hook(lambda *a, **k: self._before_state_dict("model")),
                       optimizer.register_state_dict_pre_hook(lambda *a: self._before_state_dict("optimizer")),
                       model.register_load_state_dict_post_hook(lambda *a: self._loaded("model")),
                       model.register_load_state_dict_pre_hook(lambda *a, **k: self.sync()),
                       model.register_forward_pre_hook(lambda *a: self.sync()),
                       optimizer.register_load_state_dict_post_hook(lambda *a: self._loaded("optimizer"))]
        self._lost_for: set[str] = set()  # "model", "optimizer": whose state_dict() raises
        self._publish()

    def _open_session(self) -> None:
        self.session = ExecutorSession(self.graph, self.plan, self.memory, self.model, self.optimizer,
                                       keep_state_on_failure=True)

    @property
    def predicted_seconds(self) -> float:
        return float(self.plan.meta.predicted_seconds)

    def __call__(self, *batch) -> torch.Tensor:
        if self._closed:
            raise SessionFailed("this compiled step is closed; call autotm.compile again to train on")
        if self._lost is not None:
            raise SessionFailed(self._lost)
        self._check_unchanged()
        batch = check_batch(self.graph, tuple(batch))  # a refused batch leaves the session as it was
        # hyperparameters are read at every step (a scheduler, a hand edit), as eager does
        hypers = live_groups(self.optimizer, self.graph.program.lowering, self._group_params)
        if self.session is None:  # the last step failed before it changed anything: go on from the model
            self._open_session()
            self._publish()
        else:
            self._take_edits()
        self.session.set_hyperparameters(hypers)
        try:
            r = self.session.step(tuple(batch))
        except BaseException:
            self._failed()
            raise
        self._steps_done += 1
        self._publish()
        self.optimizer._opt_called = True  # (how an lr_scheduler knows the optimizer stepped)
        if self.session.interrupted:  # Ctrl-C once the update had begun: the step was finished first
            raise KeyboardInterrupt
        return r.loss

    # ---- what the user may have changed between steps ------------------------------------
    def _check_unchanged(self) -> None:
        """Refuse changes the compiled iteration cannot follow."""
        for name, m in self.model.named_modules():
            if name in self._modes and m.training != self._modes[name]:
                mode = lambda t: "train" if t else "eval"  # noqa: E731
                raise StateChanged(f"module {name or 'the model'} ({type(m).__name__}) is in {mode(m.training)} mode "
                                   f"but was compiled in {mode(self._modes[name])} mode; a compiled step runs the mode "
                                   "it was captured in: compile again after model.train()/model.eval()")
        for name, p in self.model.named_parameters():
            if name in self._requires_grad and p.requires_grad != self._requires_grad[name]:
                raise StateChanged(f"parameter {name}: requires_grad changed to {p.requires_grad} since compile; "
                                   "compile again after freezing or unfreezing parameters")

    def _current(self, named: dict, key: str) -> torch.Tensor | None:
        kind, rest = key.split(":", 1)
        if kind in ("param", "buffer"):
            return named[rest]
        name, slot = rest.rsplit(":", 1)
        return self.optimizer.state.get(named[name], {}).get(slot)

    def _mark(self, named: dict, key: str) -> None:
        """Remember the model's (or optimizer's) tensor for `key` as we left it."""
        t = self._current(named, key)
        if key.startswith("opt:"):
            self._seen[key] = (t, None if t is None else t._version)
        else:  # (holding the storage: its address cannot be another tensor's while we compare)
            self._seen[key] = (t.untyped_storage(), t._version)

    def _changed(self, named: dict, key: str) -> str | None:
        """None, "replaced" (a new tensor: a complete value) or "edited" (in place)."""
        t = self._current(named, key)
        before, version = self._seen[key]
        if key.startswith("opt:"):
            if t is not before:
                return "replaced"
            return None if t is None or t._version == version else "edited"
        if t.untyped_storage()._cdata != before._cdata:
            return "replaced"
        return None if t._version == version else "edited"

    def _take_edits(self) -> None:
        """Carry into the next step what the user wrote into the model or optimizer since the
        last one: load_state_dict (either), replaced tensors, in-place edits. A value the plan
        keeps in slow memory is taken from the model only if the model's copy was current when
        it was edited (model.state_dict() or step.sync() since the last step), or was loaded or
        replaced whole; an edit of a stale copy is refused."""
        s, p = self.session, self.graph.program
        named = self._named()
        lowering = p.lowering
        taken = False
        tid_of = dict(p.input_keys)
        for key in list(s.carried):
            how = self._changed(named, key)
            if how is None:
                continue
            v = s.carried[key]
            slow = isinstance(v, SlowHandle)
            t = self._current(named, key)
            if t is None:  # optimizer state dropped (load_state_dict of a fresh optimizer): as torch.optim starts it
                name, slot = key[len("opt:"):].rsplit(":", 1)
                t = lowering.initial_state(p.param_groups[name], named[name], {})[slot]
            what = key.split(":", 1)[1].replace(":", " ")
            if slow and t.numel() == 0 and self.graph.tensors[tid_of[key]].nbytes > 0:
                raise StateChanged(
                    f"{what} was changed between steps, but the plan keeps it in slow memory and the model "
                    "held no copy of it (an empty tensor): call step.sync() (or state_dict()) before reading "
                    "or editing it")
            ref = self.graph.tensors[tid_of[key]]
            if tuple(t.shape) != ref.shape or str(t.dtype).replace("torch.", "") != ref.dtype:
                raise StateChanged(f"{what} is {str(t.dtype).replace('torch.', '')}{list(t.shape)} now, "
                                   f"{ref.dtype}{list(ref.shape)} when compiled; compile again")
            if not slow and how == "edited":
                continue  # (the model's tensor is the carried one: the edit is in it already)
            value = t.detach().clone()  # (ours: the user's tensor may be shared, e.g. with another optimizer)
            if slow:
                s.carried[key] = self.memory.to_slow(tid_of[key], value)
                self.memory.free_slow(v)
            else:
                s.carried[key] = value
            taken = True
        if taken:
            s.refresh_steps()
            self._publish()
        self._model_loaded = False

    def _loaded(self, who: str) -> None:
        if who == "model":
            self._model_loaded = True
        self._lost_for.discard(who)

    def _before_state_dict(self, who: str) -> None:
        if who in self._lost_for:
            raise SessionFailed(self._lost)
        self.sync()

    def _failed(self) -> None:
        """After a step raised: the model and optimizer keep the last completed step's state
        when the step had not yet overwritten any of it, else their state_dict() raises."""
        s = self.session
        if s.intact:
            self.sync()  # (slow values; the fast ones are the model's already, as last published)
            self._unarena()
            s.close()
            self.session = None
            return
        self._lost = (f"step {self._steps_done + 1} failed ({type(s.failed).__name__}) after it had begun "
                      "updating the model in place: the model and optimizer hold no step's state; load a "
                      "checkpoint into both (load_state_dict) and compile again")
        self._lost_for = {"model", "optimizer"}
        self.session = None

    def _named(self):
        named = dict(self.model.named_parameters())
        named.update(dict(self.model.named_buffers()))
        return named

    def _assign(self, named: dict, key: str, value: torch.Tensor) -> None:
        """Make `value` the model's tensor or the optimizer's state named by a state key."""
        kind, rest = key.split(":", 1)
        if kind in ("param", "buffer"):
            named[rest].data = value
        elif kind == "opt":
            name, slot = rest.rsplit(":", 1)
            self.optimizer.state[named[name]][slot] = value

    def _publish(self) -> None:
        """Point the model's tensors and the optimizer's state at the carried fast values."""
        named = self._named()
        for key, v in self.session.carried.items():
            if isinstance(v, torch.Tensor):
                self._assign(named, key, v)
            else:  # no stale copy in DRAM: a read of one fails loudly, sync() brings the value
                self._stub(named, key)
        self._synced = False
        if not hasattr(self, "_seen"):
            self._seen = {}
        for key in self.session.carried:
            self._mark(named, key)

    def _stub(self, named: dict, key: str) -> None:
        kind, rest = key.split(":", 1)
        if kind in ("param", "buffer"):
            named[rest].data = torch.empty(0, dtype=named[rest].dtype)
        else:
            name, slot = rest.rsplit(":", 1)
            self.optimizer.state.get(named[name], {}).pop(slot, None)

    def sync(self) -> None:
        """Copy values the plan keeps in slow memory into the model and optimizer (once
        between two steps: edits made since are kept)."""
        if self.session is None or self._synced:
            return
        named = self._named()
        for key, v in self.session.carried.items():
            if isinstance(v, SlowHandle):
                self._assign(named, key, self.memory.to_fast(v))
                self._mark(named, key)
        self._synced = True

    def _unarena(self) -> None:
        """Give the model copies of its tensors in the executor's arena (which goes with it)."""
        ex = self.session.executor
        named = self._named()
        for key in self.session.carried:
            v = self._current(named, key)
            if isinstance(v, torch.Tensor) and ex.in_arena(v):
                # (a copy: the model outlives the executor's arena, which goes with its last tensor)
                self._assign(named, key, v.clone())

    def report(self) -> RunReport:
        return self.session.report()

    def close(self) -> None:
        """Bring everything back to the model and release the slow tier."""
        self._closed = True
        if getattr(self, "session", None) is not None:
            self.sync()
            self._unarena()
            self.session.close()
            self.session = None
        if not getattr(self, "_lost_for", None):
            for h in getattr(self, "_hooks", []):
                h.remove()
            self._hooks = []
        if self._owned and self.memory is not None:
            self.memory.close()
            self.memory = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def compile(model: torch.nn.Module, loss_fn, optimizer: torch.optim.Optimizer, example_batch, *,
            memory: str | MemorySystem = "cpu+file", budget: Any = None, formulation: str = "asynchronous",
            cache=None, progress: bool | CompileProgress | None = None, clip_grad_norm: float | None = None,
            clip_norm_type: float = 2.0, clip_grad_value: float | None = None, **plan_options) -> CompiledStep:
    """Plan `model`'s training iteration for `memory` and `budget`; return the step function.

    `progress`: True prints each stage (capture, profile, plan) on stderr as it goes; a
    callable gets progress(stage, done, total, what); quiet by default. `plan_options` go
    to autotm.planner.plan; `time_limit` defaults to COMPILE_TIME_LIMIT (10 s) here and
    `mip_gap` to COMPILE_MIP_GAP (2 %).
    `budget`: bytes ("6GB"), a slow:fast ratio ("4:1"), or "min", the smallest budget at
    which `formulation` finds a plan. A budget under that raises autotm.InfeasibleBudget,
    which states it (before the profile where the graph alone shows it).
    `clip_grad_norm` (with `clip_norm_type`) or `clip_grad_value`: every step clips the
    gradients between backward and update as `torch.nn.utils.clip_grad_norm_(model.parameters(),
    clip_grad_norm, clip_norm_type)` or `clip_grad_value_(model.parameters(), clip_grad_value)`
    would in an eager loop, bit for bit (the step has no place for your own call).

    Example:
        >>> step = autotm.compile(model, nn.CrossEntropyLoss(), opt, (x, y), budget="4:1")
        >>> for x, y in loader:
        ...     loss = step(x, y)
        >>> model.state_dict()  # current weights
    """
    return CompiledStep(model, loss_fn, optimizer, example_batch, memory=memory, budget=budget,
                        formulation=formulation, cache=cache, progress=progress, clip_grad_norm=clip_grad_norm,
                        clip_norm_type=clip_norm_type, clip_grad_value=clip_grad_value, **plan_options)


@dataclasses.dataclass
class WorkloadRun:
    plan: Any
    report: RunReport
    identical: bool | None
    mismatches: list


def run_workload(w, graph, cost_model, plan_obj, memory: MemorySystem, *, iterations: int = 3,
                 verify: bool = False, reference=None, trim_memory: bool | None = None,
                 use_arena: bool = True) -> WorkloadRun:
    """Execute `plan_obj` for `iterations` on `memory`; with verify, compare with eager bit for bit.
    `trim_memory`, `use_arena`: as ExecutorSession (default: hold RSS near the budget when
    there is one, following the plan's arena layout)."""
    from .runtime.verify import verify_replay

    sessions: list[ExecutorSession] = []

    def factory(g, model, opt):
        s = ExecutorSession(g, plan_obj, memory, model, opt, trim_memory=trim_memory, use_arena=use_arena)
        sessions.append(s)
        return s

    if verify:
        # on a GPU, eager PyTorch runs there too, and the comparison says what needed a tolerance
        v = verify_replay(w, iterations, session_factory=factory, graph=graph, reference=reference,
                          device=memory.fast_device)
        report = sessions[0].report()
        if v.device != "cpu":
            report = dataclasses.replace(report, meta={**report.meta, **v.meta()})
        return WorkloadRun(plan_obj, report, v.identical, v.mismatches)
    model = w.build_model()
    opt = w.make_optimizer(model.parameters())
    s = factory(graph, model, opt)
    del model, opt
    try:
        for i in range(iterations):
            s.step(w.make_batch(seed=i))
        return WorkloadRun(plan_obj, s.report(), None, [])
    finally:
        s.close()


def profile_graph(graph, memory_system, cache=None, **options):
    """`autotm.profile_graph`: profile.profile with the executor's overheads measured where
    the cache has none (the runtime's calibration, which the profile stage cannot import)."""
    from .profile.profiler import profile
    from .runtime.overhead import measure_executor_overhead

    options.setdefault("measure_overhead", measure_executor_overhead)
    return profile(graph, memory_system, cache, **options)
