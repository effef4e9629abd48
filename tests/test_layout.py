"""The tree shows the pipeline: no stage imports a later one, the IR loads no torch, no
module grows past the size limit."""

import ast
import subprocess
import sys
from pathlib import Path

import autotm

PACKAGE = Path(autotm.__file__).parent
# Leaves any stage may import; they import no stage, only an earlier leaf.
LEAVES = ("errors", "zoo")
# The stages, earliest first: a module may import its own stage, an earlier one, or a leaf.
STAGES = ("ir", "tiers", "frontend", "interpret", "checks", "profile", "planner", "runtime", "api",
          "experiments", "cli")
MAX_LINES = 600
# over MAX_LINES until they are split by role: they may not grow
TO_SPLIT = {"tiers/file_tier.py": 721, "frontend/capture.py": 696, "experiments/plots.py": 668}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(module: str, path: Path):
    """(line, absolute module) of every autotm import in the file, those inside functions too."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for a in node.names:  # `from . import bench`: the module is the name
                yield node.lineno, f"{target}.{a.name}"


def _stage(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "autotm" or len(parts) == 1:
        return None
    return parts[1]


def _violations(module: str, path: Path) -> list[str]:
    here = _stage(module)
    if here is None:  # autotm/__init__.py: the facade, its names load lazily
        return []
    if here not in STAGES and here not in LEAVES:
        return [f"{module}: in no stage; add its folder to STAGES or LEAVES"]
    wrong, seen = [], set()
    for line, target in _imports(module, path):
        there = _stage(target)
        if there is None or there == here or (there not in STAGES and there not in LEAVES) or line in seen:
            continue  # not autotm, the same stage, a name from autotm's facade, or this line said
        if here in LEAVES and not (there in LEAVES and LEAVES.index(there) < LEAVES.index(here)):
            wrong.append(f"{path.name}:{line}: the leaf {here} imports {target}")
            seen.add(line)
        elif here in STAGES and there in STAGES and STAGES.index(there) > STAGES.index(here):
            wrong.append(f"{path.name}:{line}: {here} imports the later stage {target}")
            seen.add(line)
    return wrong


def test_no_stage_imports_a_later_one():
    wrong = [w for module, path in _modules() for w in _violations(module, path)]
    assert not wrong, "\n".join(wrong)


def test_a_later_stage_imported_inside_a_function_is_found(tmp_path):
    path = tmp_path / "made_up.py"
    path.write_text("from ..ir.graph import TrainingGraph\n\n\ndef f():\n    from ..runtime.executor import run\n")
    assert _violations("autotm.checks.made_up", path) == [
        "made_up.py:5: checks imports the later stage autotm.runtime.executor"]
    assert _violations("autotm.cli.made_up", path) == []


def test_importing_the_ir_the_checks_or_the_planner_loads_no_torch():
    code = ("import sys, autotm, autotm.ir.graph, autotm.ir.plan, autotm.ir.costmodel, autotm.ir.budget, "
            "autotm.ir.layout, autotm.checks.validate, autotm.checks.simulate, autotm.planner\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def _line_limit(name: str) -> int:
    return TO_SPLIT.get(name, MAX_LINES)


def test_no_module_is_over_the_line_limit():
    long = {name: n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > _line_limit(name := str(p.relative_to(PACKAGE)))}
    assert not long, long


def test_every_error_class_is_an_autotm_error_in_errors_py():
    # (a private exception used for control flow inside one module is not an error)
    from autotm import errors

    elsewhere = []
    for module, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ClassDef) and not node.name.startswith("_") and path.name != "errors.py"
                    and any(isinstance(b, ast.Name) and b.id.endswith(("Error", "Exception")) for b in node.bases)):
                elsewhere.append(f"{module}.{node.name}")
    assert not elsewhere, elsewhere
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, Exception)]
    assert len(classes) > 10 and all(issubclass(c, errors.AutotmError) for c in classes)


def test_every_autotm_import_names_a_module_that_exists():
    # a deferred import runs only when its function does: a wrong path there (after a move)
    # would pass every test that does not reach it
    known = {module for module, _ in _modules()}
    wrong = []
    for module, path in _modules():
        tree = ast.parse(path.read_text(), str(path))
        froms = {n.lineno: n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        for line, target in _imports(module, path):
            if not target.startswith("autotm") or target in known:
                continue
            node = froms.get(line)
            # `from .x import name`: the name may be an attribute of x, not a module
            if node is not None and target.rsplit(".", 1)[0] in known and target.rsplit(".", 1)[1] in {
                    a.name for a in node.names}:
                continue
            wrong.append(f"{path.relative_to(PACKAGE)}:{line}: no module {target}")
    assert not wrong, "\n".join(wrong)
