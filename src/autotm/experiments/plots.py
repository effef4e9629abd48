"""Figures 7-12 of the paper (reference §5.2) and a plan's memory timeline, from bench records.

Each `*_figure(records, memory)` builds one matplotlib figure for one memory system and
returns it with the numbers it plotted; each `FIGURES[name](records, out, tag)` writes one
PNG + SVG per memory system found in the records and returns the paths. Iteration times
are the records' `seconds`: measured when the run was executed, predicted when it was
simulated, and every title says which, and on which memory system.
"""

from __future__ import annotations

import logging
import math
import os
from collections import defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .bench import BUDGET_FREE
from ..errors import NothingToPlot
from .results import Record

log = logging.getLogger("autotm.plots")

COST_RATIO = 2.1  # DRAM $/GB over PMM $/GB, as the paper's Figure 9

MODEL_TITLES = {"vgg19": "VGG19", "vgg416": "VGG416", "resnet50": "ResNet-50", "resnet200": "ResNet-200",
                "inception_v4": "Inception v4", "densenet264": "DenseNet-264", "transformer": "Transformer"}
COLORS = {"static": "#1f77b4", "synchronous": "#2ca02c", "asynchronous": "#17becf", "first-touch": "#ff7f0e",
          "lru": "#9467bd", "all-fast": "#d62728", "all-slow": "#7f7f7f", "save-on-cpu": "#8c564b",
          "oracle": "#e377c2"}
LABELS = {"static": "static (AutoTM)", "synchronous": "sync (AutoTM)", "asynchronous": "async (AutoTM)"}
ROLE_COLORS = {"weight": "#1f77b4", "buffer": "#aec7e8", "optimizer_state": "#9467bd", "scalar": "#c5b0d5",
               "constant": "#c7c7c7", "input": "#8c564b", "activation": "#2ca02c", "gradient": "#ff7f0e",
               "update": "#bcbd22", "output": "#d62728"}


# ------------------------------------------------------------------------------ helpers

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, out: str | os.PathLike, name: str) -> list[Path]:
    """Write `fig` as OUT/name.png and OUT/name.svg; close it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    fig.savefig(paths[0], dpi=130)
    fig.savefig(paths[1])
    _plt().close(fig)
    return paths


def slug(memory: str) -> str:
    """A file-name part for a memory system: "sim:optane" -> "sim-optane", "sim:specs/x.toml" -> "sim-x"."""
    if memory.startswith("sim:") and memory.endswith(".toml"):
        memory = "sim:" + Path(memory[4:]).stem
    return memory.replace(":", "-").replace("+", "-").replace("/", "-")


def ratio_value(ratio: str) -> float:
    """Slow per fast: "4:1" -> 4, "1:0" -> inf."""
    s, f = (Fraction(x) for x in ratio.split(":"))
    return math.inf if f == 0 else float(s / f)


def memory_cost(ratio: str, cost_ratio: float = COST_RATIO) -> float:
    """Memory cost relative to all fast memory: (slow / cost_ratio + fast) / (slow + fast)."""
    s, f = (float(Fraction(x)) for x in ratio.split(":"))
    return (s / cost_ratio + f) / (s + f)


def _kind(records: Iterable[Record]) -> str:
    sim = {r.simulated for r in records}
    return "simulated" if sim == {True} else "measured" if sim == {False} else "measured and simulated"


def _title(records: Sequence[Record]) -> str:
    """'<measured|simulated> on <memory>, <preset> preset' for a figure's title."""
    presets = sorted({r.preset or "custom" for r in records})
    return f"{_kind(records)} on {records[0].memory_system}, {'/'.join(presets)} preset"


def _by_memory(records: Iterable[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        out[r.memory_system].append(r)
    return dict(out)


def _current(records: Iterable[Record]) -> list[Record]:
    """Drop records made with another cost model than the workload's latest record (a sim:
    spec whose compute peak was measured again, a new profile): times from two cost models
    are not comparable. The oracle time (sum of all-fast kernel times) identifies the model."""
    records = list(records)
    latest: dict[tuple, float] = {}
    for r in sorted(records, key=lambda r: r.timestamp):
        if r.oracle_seconds:
            latest[(r.memory_system, r.workload)] = r.oracle_seconds
    out = []
    for r in records:
        ref = latest.get((r.memory_system, r.workload))
        if r.oracle_seconds and ref and abs(r.oracle_seconds - ref) > 1e-6 * ref:
            log.warning("%s %s %s %s: made with another cost model than the latest records; not plotted",
                        r.memory_system, r.workload, r.formulation, r.budget)
            continue
        out.append(r)
    return out


def _ok(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if r.status == "ok" and r.seconds is not None]


def _find(records: Iterable[Record], workload: str, formulation: str, ratio: str | None = None,
          budget: str | None = None) -> Record | None:
    for r in records:
        if r.workload == workload and r.formulation == formulation and \
                (ratio is None or r.ratio == ratio) and (budget is None or r.budget == budget):
            return r
    return None


def _workloads(records: Iterable[Record]) -> list[tuple[str, str]]:
    """(workload, model) pairs in a stable order: by model title, then batch."""
    seen = {(r.workload, r.model, r.batch) for r in records}
    return [(w, m) for w, m, _ in sorted(seen, key=lambda x: (MODEL_TITLES.get(x[1], x[1]), x[2]))]


def _label(formulation: str) -> str:
    return LABELS.get(formulation, formulation)


def _grid(n: int, width: float = 5.2, height: float = 3.4):
    plt = _plt()
    cols = 1 if n == 1 else 2
    width = width * 1.35 if n == 1 else width
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 1.1), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _missing_mark(ax, x: float, rec: Record | None) -> None:
    """Say why a bar is absent, at its place."""
    why = "not run" if rec is None else {"infeasible": "infeasible", "unsupported": "n/a", "error": "failed",
                                         "ok": "no baseline"}.get(rec.status, rec.status)
    ax.text(x, 0.02, why, rotation=90, ha="center", va="bottom", fontsize=7, color="0.35",
            transform=ax.get_xaxis_transform())


def _legend_below(fig, axes, ncol: int | None = None) -> None:
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    if not labels:
        return
    fig.legend([handles[lab] for lab in labels], labels, loc="lower center", ncol=ncol or min(len(labels), 6),
               fontsize=8, frameon=False)


def _legend_right(ax) -> None:
    """One legend entry per label, outside the axes on the right."""
    handles = {}
    for h, lab in zip(*ax.get_legend_handles_labels()):
        handles.setdefault(lab, h)
    ax.legend(list(handles.values()), list(handles), fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0),
              frameon=False)


def _each_memory(records, build, out, name: str, tag: str) -> list[Path]:
    """One figure per memory system; skip the ones with nothing to plot (all of them: an error)."""
    paths, why = [], []
    for memory, recs in sorted(_by_memory(records).items()):
        try:
            fig, _ = build(recs, memory)
        except NothingToPlot as e:
            why.append(f"{memory}: {e}")
            continue
        paths += save(fig, out, f"{name}-{tag}-{slug(memory)}")
    if not paths:
        raise NothingToPlot("nothing to plot: " + ("; ".join(why) or "no records"))
    return paths


# ------------------------------------------------------------------------- Figure 7

def speedup_figure(records: Sequence[Record], memory: str):
    """Figure 7: speedup per ratio and model over all-slow (direct access) or over
    first-touch at the same ratio (staged), with the all-fast speedup as a red dashed line.

    Returns (figure, data) with data[model][formulation][ratio] = plotted speedup and
    data[model]["all-fast"][ratio] = the all-fast line."""
    recs = _current(r for r in records if r.memory_system == memory)
    ok = _ok(recs)
    if not ok:
        raise NothingToPlot("no finished runs")
    direct = recs[0].access == "direct"
    base_name = "all-slow" if direct else "first-touch"
    ratios = sorted({r.ratio for r in recs if r.ratio and r.ratio not in ("1:0", "0:1")}, key=ratio_value,
                    reverse=True)
    forms = [f for f in ("static", "synchronous", "asynchronous", "first-touch", "lru")
             if f != base_name and any(r.formulation == f for r in recs)]
    if not ratios or not forms:
        raise NothingToPlot("no ratio runs between 1:0 and 0:1")
    wls = _workloads(recs)
    fig, axes = _grid(len(wls))
    data: dict = {}
    width = 0.8 / len(forms)
    for ax, (wl, model) in zip(axes, wls):
        d = data.setdefault(model, {})
        fast = _find(ok, wl, "all-fast")
        for j, f in enumerate(forms):
            for i, ratio in enumerate(ratios):
                base = _find(ok, wl, base_name) if direct else _find(ok, wl, base_name, ratio)
                rec = _find(ok, wl, f, ratio)
                x = i + (j - (len(forms) - 1) / 2) * width
                if base is None or rec is None:
                    _missing_mark(ax, x, rec or _find(recs, wl, f, ratio))
                    continue
                s = base.seconds / rec.seconds
                d.setdefault(f, {})[ratio] = s
                ax.bar(x, s, width, color=COLORS[f], label=_label(f))
        if fast is not None:
            line = d.setdefault("all-fast", {})
            for ratio in ratios:
                base = _find(ok, wl, base_name) if direct else _find(ok, wl, base_name, ratio)
                if base is not None:
                    line[ratio] = base.seconds / fast.seconds
            if direct and line:
                ax.axhline(next(iter(line.values())), color=COLORS["all-fast"], ls="--", lw=1.2, label="all fast")
            else:
                for i, ratio in enumerate(ratios):
                    if ratio in line:
                        ax.hlines(line[ratio], i - 0.45, i + 0.45, color=COLORS["all-fast"], ls="--", lw=1.2,
                                  label="all fast")
        ax.axhline(1.0, color="0.3", lw=0.6)
        ax.set_xlim(-0.5, len(ratios) - 0.5)
        ax.set_xticks(range(len(ratios)), ratios)
        ax.set_title(f"{MODEL_TITLES.get(model, model)} ({recs[0].preset} preset, batch {_batch(recs, wl)})",
                     fontsize=10)
        ax.set_xlabel("slow : fast memory ratio")
        ax.set_ylabel(f"speedup over {base_name}")
        top = max([v for f in d.values() for v in f.values()] + [1.0])
        ax.set_ylim(0, top * 1.15)
    if not any(f != "all-fast" for d in data.values() for f in d):
        _plt().close(fig)
        raise NothingToPlot(f"no runs to compare with {base_name}")
    fig.suptitle(f"Figure 7: speedup over {base_name}" + ("" if direct else " at the same ratio") +
                 f"\n({_title(recs)})", fontsize=11)
    _legend_below(fig, axes)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    return fig, data


def _batch(records, workload: str) -> int:
    return next(r.batch for r in records if r.workload == workload)


def speedup(records, out, tag: str = "conventional") -> list[Path]:
    return _each_memory(records, speedup_figure, out, "fig7-speedup", tag)


# ------------------------------------------------------------------------- Figure 8

def large_figure(records: Sequence[Record], memory: str):
    """Figure 8: speedup over lru (2LM's analogue) of each formulation per large workload.
    data[(model, batch, budget)][formulation] = speedup."""
    recs = _current(r for r in records if r.memory_system == memory)
    ok = _ok(recs)
    budgets = sorted({r.budget for r in recs if r.budget})
    forms = sorted({r.formulation for r in recs if r.formulation != "lru"}, key=list(COLORS).index)
    groups = [(wl, m, b) for wl, m in _workloads(recs) for b in budgets]
    if not any(_find(ok, wl, "lru", budget=b) for wl, _, b in groups) or not forms:
        raise NothingToPlot("no lru baseline runs")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) + 2), 4.4))
    width = 0.8 / len(forms)
    data: dict = {}
    for i, (wl, model, b) in enumerate(groups):
        base = _find(ok, wl, "lru", budget=b)
        for j, f in enumerate(forms):
            x = i + (j - (len(forms) - 1) / 2) * width
            rec = _find(ok, wl, f) if f in BUDGET_FREE else _find(ok, wl, f, budget=b)
            if base is None or rec is None:
                _missing_mark(ax, x, rec or _find(recs, wl, f, budget=b))
                continue
            s = base.seconds / rec.seconds
            data.setdefault((model, _batch(recs, wl), b), {})[f] = s
            ax.bar(x, s, width, color=COLORS.get(f, "0.5"), label=_label(f))
            ax.text(x, s, f"{s:.2f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="0.3", lw=0.8, label="lru")
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.set_xticks(range(len(groups)), [f"{MODEL_TITLES.get(m, m)}\n(batch {_batch(recs, wl)})" +
                                       (f"\nfast {b}" if len(budgets) > 1 else "") for wl, m, b in groups],
                  fontsize=8)
    ax.set_ylabel("speedup over lru")
    top = max([v for d in data.values() for v in d.values()] + [1.0])
    ax.set_ylim(0, top * 1.18)
    ax.set_title(f"Figure 8: large networks, speedup over lru at a fast budget of {', '.join(budgets)}\n"
                 f"({_title(recs)})", fontsize=10)
    _legend_right(ax)
    fig.tight_layout()
    return fig, data


def large(records, out, tag: str = "large") -> list[Path]:
    return _each_memory(records, large_figure, out, "fig8-large", tag)


# ------------------------------------------------------------------------- Figure 9

COST_RATIOS = ("1:0", "8:1", "4:1", "1:1")


def costs_figure(records: Sequence[Record], memory: str, formulation: str | None = None):
    """Figure 9: performance relative to all-fast (bars, left axis) for the AutoTM plan
    (synchronous, else static) at 1:0, 8:1, 4:1 and 1:1, next to the
    memory cost relative to all-fast ("$" marks, right axis, cost_ratio 2.1).
    data[model][ratio] = performance relative to all-fast."""
    recs = _current(r for r in records if r.memory_system == memory)
    ok = _ok(recs)
    if formulation is None:  # the paper's: synchronous; static where a direct system has no synchronous runs
        formulation = "synchronous" if any(r.formulation == "synchronous" for r in ok) else "static"
    wls = [(wl, m) for wl, m in _workloads(recs) if _find(ok, wl, "all-fast") and _find(ok, wl, formulation)]
    if not wls:
        raise NothingToPlot(f"no all-fast and {formulation} runs")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.5, 2.2 * len(wls) + 2.5), 4.2))
    ax2 = ax.twinx()
    width = 0.8 / len(COST_RATIOS)
    cmap = plt.get_cmap("Blues")
    data: dict = {}
    for i, (wl, model) in enumerate(wls):
        fast = _find(ok, wl, "all-fast")
        for j, ratio in enumerate(COST_RATIOS):
            x = i + (j - (len(COST_RATIOS) - 1) / 2) * width
            ax2.plot(x, memory_cost(ratio), marker="$\\$$", ms=9, color="k", ls="none",
                     label="memory cost (right axis)")
            rec = _find(ok, wl, formulation, ratio)
            if rec is None:
                _missing_mark(ax, x, _find(recs, wl, formulation, ratio))
                continue
            v = fast.seconds / rec.seconds
            data.setdefault(model, {})[ratio] = v
            ax.bar(x, v, width, color=cmap(0.35 + 0.6 * j / (len(COST_RATIOS) - 1)), label=f"{ratio} slow:fast")
    ax.set_xticks(range(len(wls)), [MODEL_TITLES.get(m, m) for _, m in wls])
    ax.set_ylim(0, 1.15)
    ax2.set_ylim(0, 1.15)
    ax.set_ylabel(f"performance relative to all-fast\n({_label(formulation)})")
    ax2.set_ylabel(f"memory cost relative to all-fast\n(fast \\$/GB = {COST_RATIO} x slow \\$/GB)")
    ax.set_xlim(-0.6, len(wls) - 0.4)
    ax.set_title(f"Figure 9: performance and memory cost ({_title(recs)})", fontsize=10)
    handles = {}
    for a in (ax, ax2):
        for h, lab in zip(*a.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig, data


def costs(records, out, tag: str = "conventional") -> list[Path]:
    return _each_memory(records, costs_figure, out, "fig9-costs", tag)


# ------------------------------------------------------------------------- Figure 10

def case_study_figure(records: Sequence[Record], memory: str):
    """Figure 10a-c against the fast budget (GB): (a) slowdown relative to all-fast,
    (b) fraction of kernel input and output bytes in fast memory (staged access: input
    bytes kept resident rather than moved back), (c) GB moved to slow and to fast memory.
    The dashed vertical line is the all-fast footprint. data[formulation] = {"budget_gb",
    "slowdown", "inputs_fast", "outputs_fast", "gb_to_slow", "gb_to_fast"} lists."""
    recs = _current(r for r in records if r.memory_system == memory)
    ok = _ok(recs)
    wls = _workloads(ok)
    if not wls:
        raise NothingToPlot("no finished runs")
    wl, model = wls[0]
    recs = [r for r in recs if r.workload == wl]
    ok = [r for r in ok if r.workload == wl]
    fast = _find(ok, wl, "all-fast")
    forms = [f for f in COLORS if f != "all-fast" and any(r.formulation == f for r in ok if r.ratio)]
    if fast is None or not forms:
        raise NothingToPlot("no all-fast run or no budgeted runs")
    staged = recs[0].access == "staged"
    plt = _plt()
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.4))
    data: dict = {}
    for f in forms:
        rs = sorted((r for r in ok if r.formulation == f and r.ratio), key=lambda r: r.budget_bytes)
        x = [r.budget_bytes / 1e9 for r in rs]
        d = data[f] = {
            "budget_gb": x,
            "slowdown": [r.seconds / fast.seconds for r in rs],
            "inputs_fast": [(r.kernel_input_bytes_kept if staged else r.kernel_input_bytes_fast) / r.kernel_input_bytes
                            for r in rs],
            "outputs_fast": [r.kernel_output_bytes_fast / r.kernel_output_bytes for r in rs],
            "gb_to_slow": [(r.sync_bytes_to_slow + r.async_bytes_to_slow) / 1e9 for r in rs],
            "gb_to_fast": [(r.sync_bytes_to_fast + r.async_bytes_to_fast) / 1e9 for r in rs],
        }
        color = COLORS[f]
        a.plot(x, d["slowdown"], marker="o", ms=3.5, color=color, label=_label(f))
        b.plot(x, d["inputs_fast"], marker="o", ms=3.5, color=color, label=f"{_label(f)}: inputs")
        if not staged:
            b.plot(x, d["outputs_fast"], marker="s", ms=3.5, ls="--", color=color, label=f"{_label(f)}: outputs")
        c.plot(x, d["gb_to_fast"], marker="o", ms=3.5, color=color, label=f"{_label(f)}: slow to fast")
        c.plot(x, d["gb_to_slow"], marker="v", ms=3.5, ls="--", color=color, label=f"{_label(f)}: fast to slow")
    foot = fast.peak_live_bytes / 1e9
    for ax in (a, b, c):
        ax.axvline(foot, color="0.4", ls=":", lw=1, label="all-fast footprint")
        ax.set_xlabel("fast memory budget (GB)")
        ax.grid(alpha=0.3)
    a.set_ylabel("slowdown relative to all-fast")
    a.set_title("(a) iteration time", fontsize=10)
    b.set_ylabel("fraction of kernel operand bytes" + (" kept fast" if staged else " in fast memory"))
    b.set_ylim(-0.02, 1.05)
    b.set_title("(b) kernel inputs" + (" not moved back for their use" if staged else " and outputs in fast memory"),
                fontsize=10)
    c.set_ylabel("GB moved per iteration")
    c.set_title("(c) bytes moved", fontsize=10)
    moved = [v for d in data.values() for v in d["gb_to_fast"] + d["gb_to_slow"]]
    if not any(moved):
        c.text(0.5, 0.5, "no plan moves anything\n(direct access: tensors are read in place)",
               transform=c.transAxes, ha="center", va="center", fontsize=9, color="0.3")
    for ax in (a, b, c):
        ax.legend(fontsize=7, loc="best")
    missing: dict[tuple, int] = defaultdict(int)
    for r in recs:
        if r.status in ("unsupported", "error"):
            missing[(r.formulation, r.status, r.message.split(":")[0])] += 1
    notes = [f"{f}: {n} {status} ({why})" for (f, status, why), n in sorted(missing.items())]
    fig.suptitle(f"Figure 10: {MODEL_TITLES.get(model, model)} (batch {fast.batch}) case study, {_title(recs)}" +
                 (f"\nbudgets not shown: {'; '.join(notes)}" if notes else ""), fontsize=10)
    fig.tight_layout()
    return fig, data


def case_study(records, out, tag: str = "case-study") -> list[Path]:
    return _each_memory(records, case_study_figure, out, "fig10-case-study", tag)


# ------------------------------------------------------------------------- Figure 11

def error_figure(records: Sequence[Record], memory: str):
    """Figure 11: prediction error 100 (predicted - measured) / measured per ratio, per model
    and formulation, for executed runs only. data[model][formulation][ratio or "-"] = percent."""
    recs = _current(r for r in records if r.memory_system == memory and not r.simulated)
    ok = [r for r in _ok(recs) if r.predicted_seconds is not None and r.measured_seconds]
    if not ok:
        raise NothingToPlot("no executed runs with a prediction")
    wls = _workloads(ok)
    fig, axes = _grid(len(wls), width=6.2)
    data: dict = {}
    for ax, (wl, model) in zip(axes, wls):
        rs = [r for r in ok if r.workload == wl]
        cols = sorted({r.ratio or "-" for r in rs}, key=lambda x: -1 if x == "-" else -ratio_value(x)
                      if ratio_value(x) != math.inf else -1e9)
        cols = [c for c in cols if c != "-"] + (["-"] if "-" in cols else [])
        # each group holds the formulations run at that ratio, centred on its tick
        groups = [[r for f in COLORS for r in rs if r.formulation == f and (r.ratio or "-") == col] for col in cols]
        width = 0.8 / max(len(g) for g in groups)
        d = data.setdefault(model, {})
        for i, (col, group) in enumerate(zip(cols, groups)):
            for j, rec in enumerate(group):
                e = 100.0 * (rec.predicted_seconds - rec.measured_seconds) / rec.measured_seconds
                d.setdefault(rec.formulation, {})[col] = e
                x = i + (j - (len(group) - 1) / 2) * width
                ax.bar(x, e, width, color=COLORS[rec.formulation], label=_label(rec.formulation))
                ax.text(x, e, f"{e:+.0f}", ha="center", va="bottom" if e >= 0 else "top", fontsize=7)
        ax.axhline(0, color="0.3", lw=0.8)
        lo, hi = min([0.0] + [v for f in d.values() for v in f.values()]), max([0.0] + [v for f in d.values()
                                                                                       for v in f.values()])
        pad = 0.12 * max(hi - lo, 1.0)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xticks(range(len(cols)), [c if c != "-" else "no budget\n(" + ", ".join(r.formulation for r in g) + ")"
                                         for c, g in zip(cols, groups)])
        ax.set_xlabel("slow : fast memory ratio")
        ax.set_ylabel("prediction error (%)\n(predicted - measured) / measured")
        ax.set_title(f"{MODEL_TITLES.get(model, model)} ({rs[0].preset} preset, batch {rs[0].batch})", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Figure 11: prediction error of the cost model ({_title(ok)})", fontsize=11)
    _legend_below(fig, axes)
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    return fig, data


def error(records, out, tag: str = "conventional") -> list[Path]:
    return _each_memory(records, error_figure, out, "fig11-error", tag)


# ------------------------------------------------------------------------- Figure 12

GPU_BARS = ("synchronous", "asynchronous", "save-on-cpu", "all-fast")


def gpu_figure(records: Sequence[Record], memory: str):
    """Figure 12: speedup over lru at each fast budget of sync, async, save-on-cpu and
    all-fast, and of the oracle (the sum of the profiled kernel times: no memory limit and
    no moves). data[(model, batch, budget)][bar] = speedup."""
    recs = _current(r for r in records if r.memory_system == memory)
    ok = _ok(recs)
    budgets = sorted({r.budget for r in recs if r.budget}, key=ratio_or_size)
    groups = [(wl, m, b) for b in budgets for wl, m in _workloads(recs) if _find(ok, wl, "lru", budget=b)]
    if not groups:
        raise NothingToPlot("no lru baseline runs")
    bars = [f for f in GPU_BARS if any(r.formulation == f for r in recs)] + ["oracle"]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(groups) + 2.5), 4.6))
    width = 0.8 / len(bars)
    data: dict = {}
    for i, (wl, model, b) in enumerate(groups):
        base = _find(ok, wl, "lru", budget=b)
        for j, f in enumerate(bars):
            x = i + (j - (len(bars) - 1) / 2) * width
            if f == "oracle":
                t = base.oracle_seconds
            else:
                rec = _find(ok, wl, f) if f in ("save-on-cpu", "all-fast") else _find(ok, wl, f, budget=b)
                if rec is None:
                    _missing_mark(ax, x, _find(recs, wl, f, budget=None if f in ("save-on-cpu", "all-fast") else b))
                    continue
                t = rec.seconds
            if not t:
                continue
            s = base.seconds / t
            data.setdefault((model, base.batch, b), {})[f] = s
            ax.bar(x, s, width, color=COLORS[f], label=_label(f) if f != "oracle" else "oracle (kernel time only)")
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.set_xticks(range(len(groups)), [f"{MODEL_TITLES.get(m, m)}\nbatch {_batch(recs, wl)}\nfast {b}"
                                       for wl, m, b in groups], fontsize=8)
    ax.set_ylabel("speedup over lru")
    ax.set_title(f"Figure 12: GPU workloads, speedup over lru ({_title(recs)})", fontsize=10)
    _legend_right(ax)
    fig.tight_layout()
    return fig, data


def ratio_or_size(budget: str):
    return (0, -ratio_value(budget)) if ":" in budget else (1, budget)


def gpu(records, out, tag: str = "gpu") -> list[Path]:
    return _each_memory(records, gpu_figure, out, "fig12-gpu", tag)


# ------------------------------------------------------------------------- timeline

def fast_bytes_by_role(plan, graph) -> dict[str, np.ndarray]:
    """Fast-tier bytes of each tensor role while each kernel runs (the plan timeline's step 3,
    so the sum over roles equals `validate(plan, graph).fast_bytes`): the validator's fast
    blocks, less what it counts once at a kernel whose output is written over a dying
    input (taken from that input's role)."""
    from ..checks.validate import validate
    from ..interpret.replay import in_place_inputs

    n = len(graph.kernels)
    report = validate(plan, graph, budget_bytes=2**62)
    delta: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(n + 1, dtype=np.int64))
    for b in report.fast_blocks:
        k0, k1 = b.start // 2, (b.end - 1) // 2  # kernels k with start <= 2k + 1 <= end
        if k1 >= k0:
            d = delta[graph.tensors[b.tensor].role.value]
            d[k0] += b.nbytes
            d[k1 + 1] -= b.nbytes
    out = {role: np.cumsum(d[:-1]) for role, d in delta.items()}
    counted_once = sum(out.values(), np.zeros(n, dtype=np.int64)) - report.fast_bytes
    over = in_place_inputs(graph)
    for k in np.flatnonzero(counted_once):
        out[graph.tensors[over[k]].role.value][k] -= counted_once[k]
    return {role: v for role, v in out.items() if v.any()}


def moves_by_kernel(plan, graph) -> dict[str, np.ndarray]:
    """Bytes copied at each kernel: keys "sync to fast", "async to fast", "sync to slow", "async to slow"."""
    n = len(graph.kernels)
    out = {f"{m} to {d}": np.zeros(n) for m in ("sync", "async") for d in ("fast", "slow")}
    for tp in plan.tensors:
        for a in tp.actions:
            if a.kind != "drop":
                out[f"{a.mode} to {'fast' if a.kind == 'prefetch' else 'slow'}"][a.at] += graph.tensors[tp.id].nbytes
    return out


def timeline_figure(plan, graph, budget_label: str | None = None):
    """Fast-tier bytes over the kernels stacked by tensor role, the budget as a line, and the
    bytes each kernel's moves copy (below). Returns (figure, fast_bytes_by_role)."""
    plt = _plt()
    roles = fast_bytes_by_role(plan, graph)
    moves = moves_by_kernel(plan, graph)
    order = [r for r in ROLE_COLORS if r in roles]
    x = np.arange(len(graph.kernels))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 5.6), sharex=True, gridspec_kw={"height_ratios": (3, 1.3)})
    scale = 2**20 if graph.peak_live_bytes < 4 * 2**30 else 2**30
    unit = "MiB" if scale == 2**20 else "GiB"
    top.stackplot(x, *[roles[r] / scale for r in order], labels=order, colors=[ROLE_COLORS[r] for r in order],
                  step="mid", lw=0)
    top.plot(x, graph.live_bytes / scale, color="0.3", lw=0.8, ls=":", label="all-fast footprint")
    if plan.budget_bytes is not None:
        top.axhline(plan.budget_bytes / scale, color="k", lw=1.2, ls="--", label="fast budget")
    top.set_ylabel(f"fast-tier bytes ({unit})")
    top.set_ylim(0, graph.peak_live_bytes / scale * 1.08)
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    styles = {"sync to fast": ("#2ca02c", 1), "async to fast": ("#98df8a", 1), "sync to slow": ("#d62728", -1),
              "async to slow": ("#ff9896", -1)}
    for name, (color, sign) in styles.items():
        v = moves[name]
        if v.any():
            nz = np.nonzero(v)[0]
            bottom.vlines(nz, 0, sign * v[nz] / scale, color=color, lw=1.2, label=name)
    bottom.axhline(0, color="0.3", lw=0.6)
    bottom.set_ylabel(f"moved ({unit})\nto fast + / to slow -")
    bottom.set_xlabel("kernel (execution order)")
    if any(v.any() for v in moves.values()):
        bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    else:
        bottom.text(0.5, 0.5, "no moves", transform=bottom.transAxes, ha="center", va="center", color="0.4")
    sim = bool(plan.meta.simulated)
    budget = budget_label or (f"{plan.budget_bytes / scale:.1f} {unit}" if plan.budget_bytes else "no budget")
    pred = plan.meta.predicted_seconds
    top.set_title(f"{graph.name}: {plan.meta.formulation or plan.planner} plan at {budget} on "
                  f"{plan.memory_system} ({'simulated hardware' if sim else 'real tiers'}; planned, "
                  f"predicted {pred:.3g} s/iteration)" if pred is not None else "", fontsize=10)
    fig.tight_layout()
    return fig, roles


def timeline(plan, graph, out, budget_label: str | None = None) -> list[Path]:
    fig, _ = timeline_figure(plan, graph, budget_label)
    name = f"timeline-{graph.name}-{plan.meta.formulation or plan.planner}-{slug(plan.memory_system)}"
    if budget_label:
        name += "-" + budget_label.replace(":", "to")
    return save(fig, out, name)


FIGURES = {"speedup": speedup, "large": large, "costs": costs, "case-study": case_study, "error": error, "gpu": gpu}


def plot_experiment(experiment: str, out, records: Sequence[Record] | None = None) -> list[Path]:
    """The figures an experiment's records support (the Test Run: Figures 7, 9 and 11)."""
    from .results import store_for

    recs = store_for(out, experiment).latest() if records is None else records
    names = {"conventional": ("speedup", "costs", "error"), "test": ("speedup", "costs", "error"),
             "case-study": ("case-study",), "large": ("large",), "gpu": ("gpu",)}[experiment]
    paths: list[Path] = []
    for name in names:
        try:
            paths += FIGURES[name](recs, out, tag=experiment)
        except NothingToPlot:
            continue
    return paths
