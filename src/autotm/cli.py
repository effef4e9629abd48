"""The `autotm` command line.

Errors the user can act on (unknown model, bad size, uncapturable op, ...) are printed as
one line and exit with status 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="autotm: plan and run PyTorch training whose memory footprint exceeds fast memory (AutoTM, ASPLOS 2020).",
)
console = Console()
err_console = Console(stderr=True)


class _Options:
    debug = False


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")) -> None:
    _Options.debug = debug


def _workload(model: str, preset: Optional[str], batch: Optional[int], image: Optional[int]):
    from .zoo import workload

    if preset is None and (batch is None or image is None):
        preset = "test"
    return workload(model, preset, batch=batch, image=image)


MODEL_ARG = typer.Argument(..., help="vgg19, vgg416, resnet50, resnet200, inception_v4, densenet264 or transformer.")
PRESET_OPT = typer.Option(None, "--preset", "-p", help="test, cpu, conventional, large or gpu (default: test).")
BATCH_OPT = typer.Option(None, "--batch", "-b", help="Batch size (overrides the preset's).")
IMAGE_OPT = typer.Option(None, "--image", "-i", help="Image size, or sequence length for the transformer.")


@app.command()
def graph(
    model: str = MODEL_ARG,
    preset: Optional[str] = PRESET_OPT,
    batch: Optional[int] = BATCH_OPT,
    image: Optional[int] = IMAGE_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Capture one training iteration on fake tensors and summarize its graph."""
    from .workloads import capture_workload

    w = _workload(model, preset, batch, image)
    with console.status(f"capturing {w.name} on fake tensors ...", spinner="dots") if not as_json else _null():
        g = capture_workload(w, fake=True)
    s = g.summary()
    s.update(model=w.model, preset=w.preset, batch=w.batch, image=w.image)
    if as_json:
        print(json.dumps(s))
        return
    t = Table(title=f"{w.name}: one training iteration", show_header=False)
    t.add_row("kernels", f"{s['kernels']:,} ({s['unique_kernels']:,} unique signatures)")
    t.add_row("tensors (storages)", f"{s['tensors']:,}")
    t.add_row("parameters", f"{s['parameters']:,}")
    t.add_row("FLOPs", f"{s['flops']:.3e}")
    t.add_row("peak live bytes", f"{human_bytes(s['peak_live_bytes'])} at kernel {s['peak_kernel']} ({g.kernels[s['peak_kernel']].op})")
    for role, b in sorted(s["peak_live_bytes_by_role"].items(), key=lambda kv: -kv[1]):
        t.add_row(f"  at peak: {role}", human_bytes(b))
    t.add_row("capture seconds", f"{s['capture_seconds']:.2f}")
    console.print(t)


@app.command()
def demo() -> None:
    """The main job on the embedded default: capture the test model, replay it, verify bit for bit."""
    from .verify import verify_replay
    from .zoo import workload

    w = workload("vgg19", "test")
    console.print(f"[bold]autotm demo[/bold]: {w.name} (the artifact's test_vgg), SGD with momentum, 3 iterations")
    with console.status("capturing and replaying ...", spinner="dots"):
        r = verify_replay(w, iterations=3)
    g = r.graph
    t = Table(title="captured training iteration")
    t.add_column("kernels", justify="right")
    t.add_column("unique", justify="right")
    t.add_column("tensors", justify="right")
    t.add_column("parameters", justify="right")
    t.add_column("peak live", justify="right")
    t.add_column("capture s", justify="right")
    t.add_row(f"{len(g.kernels):,}", f"{g.unique_signatures:,}", f"{len(g.tensors):,}", f"{g.parameters:,}",
              human_bytes(g.peak_live_bytes), f"{g.capture_seconds:.2f}")
    console.print(t)
    v = Table(title="replay versus eager PyTorch")
    v.add_column("iteration", justify="right")
    v.add_column("eager loss", justify="right")
    v.add_column("replay loss", justify="right")
    v.add_column("loss, gradients identical")
    for i, (a, b, same) in enumerate(zip(r.eager_losses, r.replay_losses, r.identical_per_iteration)):
        v.add_row(str(i + 1), f"{a:.6f}", f"{b:.6f}", "[green]yes[/green]" if same else "[red]NO[/red]")
    console.print(v)
    console.print(f"updated weights and optimizer state identical after 3 iterations: "
                  f"{'[green]yes[/green]' if r.state_identical else '[red]NO[/red]'}")
    console.print("[dim]Tiered execution and the ILP planner arrive with the runtime and planner issues; "
                  "this demo shows capture and bit-exact replay only.[/dim]")
    if not r.identical:
        raise typer.Exit(1)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main() -> None:
    from .errors import AutotmError

    try:
        app(standalone_mode=False)
    except (AutotmError, ValueError) as e:
        if _Options.debug:
            raise
        err_console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as e:
        # usage errors of the click that typer bundles: show them the usual way
        if hasattr(e, "show") and hasattr(e, "exit_code"):
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":
            sys.exit(130)
        raise


if __name__ == "__main__":
    main()
