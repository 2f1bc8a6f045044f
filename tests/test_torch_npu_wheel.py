"""The harness against the real torch_npu wheel, where one is installed (`make test`,
`make test-torch TORCH=...`), and against the sources of every supported wheel (`make test-npu-api`).

Without the Ascend CANN toolkit `import torch_npu` fails, so the wheel cannot be driven here. What
can be checked is its Python sources: every torch_npu name the harness uses
(`harness.devices.TORCH_NPU_API`) must be defined there, so a renamed API fails this test instead
of a sweep on an Ascend host. And with the wheel installed, detection and every read of a card's
description must still answer, never crash, and say why the NPU is unusable.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.devices import TORCH_NPU_API

DEVICES = Path(__file__).resolve().parents[1] / "harness" / "devices"


def installed_wheel() -> Path:
    """The installed torch_npu package folder, found without importing it (that needs CANN)."""
    spec = importlib.util.find_spec("torch_npu")
    if spec is None or spec.origin is None:
        pytest.skip("torch_npu is not installed here; `make test` installs it")
    return Path(spec.origin).parent


def wheel_sources() -> list[Path]:
    """The torch_npu package folders whose sources are checked: those TORCH_NPU_SOURCES lists
    (unpacked wheels, separated by os.pathsep: `make test-npu-api`), else the installed one."""
    listed = os.environ.get("TORCH_NPU_SOURCES", "")
    if listed:
        return [Path(p) for p in listed.split(os.pathsep) if p]
    spec = importlib.util.find_spec("torch_npu")
    return [Path(spec.origin).parent] if spec is not None and spec.origin is not None else []


def used_torch_npu_paths(source: str) -> set[str]:
    """Every attribute path rooted at `torch_npu` (or `torch.npu`, which is `torch_npu.npu`)."""
    tree = ast.parse(source)
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    paths = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        dotted = ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""
        if dotted.startswith("torch_npu."):
            paths.add(dotted)
        elif dotted.startswith("torch.npu."):
            paths.add("torch_npu." + dotted.removeprefix("torch."))
    return paths


def test_the_list_of_torch_npu_names_is_what_the_harness_uses() -> None:
    used = set().union(*(used_torch_npu_paths(f.read_text()) for f in DEVICES.glob("*.py")))
    assert used == set(TORCH_NPU_API)


# What a name is bound to in the wheel's sources, as far as they can be followed without running them.
@dataclass(frozen=True)
class Module:
    path: Path  # a package is its __init__.py


@dataclass(frozen=True)
class Class:
    node: ast.ClassDef = field(compare=False)
    module: Module


DEFINED = "defined"  # bound to a function, a value or an outside module: nothing to follow further
Scope = Module | Class | str


class WheelSources:
    def __init__(self, package: Path) -> None:
        self.package = package
        self._trees: dict[Path, ast.Module] = {}

    def defines(self, path: str) -> bool:
        _root, *parts = path.split(".")
        if parts[0] == "_C":  # the C extension: its function names are C strings in the shared libraries
            name = b"\0" + parts[1].encode() + b"\0"
            return len(parts) == 2 and any(name in lib.read_bytes() for lib in self.package.rglob("*.so"))
        scope: Scope | None = Module(self.package / "__init__.py")
        for part in parts:
            if not isinstance(scope, (Module, Class)):
                return False
            scope = self.lookup(scope, part)
        return scope is not None

    def lookup(self, scope: Module | Class, name: str) -> Scope | None:
        if isinstance(scope, Class):
            return DEFINED if name in class_attributes(scope.node) else None
        found = self.binding(scope, name)
        return found if found is not None else self.submodule(scope, name)

    def submodule(self, module: Module, name: str) -> Module | None:
        if module.path.name != "__init__.py":
            return None
        folder = module.path.parent
        for candidate in (folder / name / "__init__.py", folder / f"{name}.py"):
            if candidate.is_file():
                return Module(candidate)
        return None

    def imported(self, node: ast.ImportFrom, module: Module) -> Module | None:
        """The torch_npu module an import reads from; None for any other package."""
        if node.level:
            folder = module.path.parent
            for _ in range(node.level - 1):
                folder = folder.parent
            target: Module | None = Module(folder / "__init__.py")
            parts = node.module.split(".") if node.module else []
        elif node.module and node.module.split(".")[0] == "torch_npu":
            target, parts = Module(self.package / "__init__.py"), node.module.split(".")[1:]
        else:
            return None
        for part in parts:
            target = self.submodule(target, part) if target else None
        return target

    def binding(self, module: Module, name: str) -> Scope | None:
        stars = []
        for node in top_level(self.tree(module.path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return DEFINED
            if isinstance(node, ast.ClassDef) and node.name == name:
                return Class(node, module)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in assigned_names(node):
                return self.value_of(node.value, module) if node.value else DEFINED
            if isinstance(node, ast.Import) and any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return DEFINED
            if isinstance(node, ast.ImportFrom):
                source = self.imported(node, module)
                for alias in node.names:
                    if alias.name == "*":
                        stars.append(source)
                    elif (alias.asname or alias.name) == name:
                        return DEFINED if source is None else self.lookup(source, alias.name)
        for source in stars:
            if source is not None and name in exported(self.tree(source.path), name):
                found = self.binding(source, name)
                if found is not None:
                    return found
        return None

    def value_of(self, value: ast.expr, module: Module) -> Scope:
        """`matmul = npu_config._allowHF32Matmul()`: an instance answers for its class's attributes."""
        if isinstance(value, ast.Call):
            return self.value_of(value.func, module)
        if isinstance(value, ast.Name):
            return self.lookup(module, value.id) or DEFINED
        if isinstance(value, ast.Attribute):
            owner = self.value_of(value.value, module)
            return (self.lookup(owner, value.attr) if isinstance(owner, (Module, Class)) else None) or DEFINED
        return DEFINED

    def tree(self, path: Path) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(path.read_text(encoding="utf-8"))
        return self._trees[path]


def top_level(tree: ast.Module) -> list[ast.AST]:
    """Module-level statements, those inside `if`, `try` and `with` included."""
    found: list[ast.AST] = []
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop(0)
        found.append(node)
        if isinstance(node, (ast.If, ast.Try, ast.With, ast.ExceptHandler)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                pending.extend(getattr(node, block, []))
    return found


def assigned_names(node: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def exported(tree: ast.Module, name: str) -> set[str]:
    """What `from module import *` binds, as far as `name` goes: `__all__` if the module has one."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and "__all__" in assigned_names(node)
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return set() if name.startswith("_") else {name}


def class_attributes(node: ast.ClassDef) -> set[str]:
    """Names a class defines, and the names its `__getattr__`/`__setattr__` answer to
    (torch_npu's `matmul.allow_hf32` is one: `if name == "allow_hf32"`)."""
    names = set()
    for item in node.body:
        if isinstance(item, (ast.Assign, ast.AnnAssign)):
            names |= assigned_names(item)
        elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
            if item.name in ("__getattr__", "__setattr__"):
                names |= {
                    c.value
                    for compare in ast.walk(item)
                    if isinstance(compare, ast.Compare)
                    for c in compare.comparators
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
    return names


@pytest.mark.parametrize("package", wheel_sources() or [None], ids=lambda p: p.parent.name if p else "no-wheel")
def test_every_torch_npu_name_the_harness_uses_is_defined_in_the_installed_wheel(package: Path | None) -> None:
    if package is None:
        pytest.skip("torch_npu is not installed here; `make test` and `make test-npu-api` run this")
    assert (package / "__init__.py").is_file(), f"{package} is not a torch_npu package folder"
    sources = WheelSources(package)
    missing = [path for path in TORCH_NPU_API if not sources.defines(path)]
    assert not missing, f"not defined in {sources.package}: {missing}"
    assert not sources.defines("torch_npu.npu.matmul.allow_tf32")  # the check can fail


def test_with_the_real_wheel_every_read_answers_and_says_why_the_npu_is_unusable() -> None:
    """In a fresh process, as an actor or `harness info` would start: nothing raises, and without
    CANN the NPU is unavailable with torch_npu's own reason."""
    installed_wheel()
    code = (
        "import json; import harness.devices as d; "
        "print(json.dumps({'available': d.accelerator('npu').detect(), 'local': d.describe_local()['npu'], "
        "'settings': d.read_precision('npu'), 'runtime': d.runtime_versions('npu')}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    ok, why = found["available"]
    assert (found["local"]["available"], found["local"]["reason"]) == (ok, why)
    npu_settings = {k: v for k, v in found["settings"].items() if k.startswith("torch_npu.")}
    assert len(npu_settings) == 5
    if ok:  # an Ascend host with CANN: the reads answer
        assert found["runtime"]["torch_npu"] and found["settings"]["torch_npu.npu.matmul.allow_hf32"] is not None
        return
    assert why.startswith("torch_npu is not importable (") and len(why) > len("torch_npu is not importable ()")
    assert all(v.startswith("unreadable: RuntimeError: torch_npu is not importable (") for v in npu_settings.values())
    assert found["local"]["devices"] == []
    assert found["runtime"]["torch_npu"] == found["runtime"]["cann"] == ""


ENTRY_POINTS = {
    # What each way in imports first, then torch itself, as the process Ray or a user starts would.
    "harness info": ["-m", "harness", "info"],
    "ray job submit's entry point": ["jobs/sweep.py", "--help"],
    "an actor's worker": ["-c", "import actors.policy_actor, actors.bench_actor, torch; torch.ones(1)"],
    "the benchmarks": ["-c", "import benchmarks.card_scaling, torch; torch.ones(1)"],
}


@pytest.mark.parametrize("argv", ENTRY_POINTS.values(), ids=ENTRY_POINTS.keys())
def test_every_way_in_sets_the_guard_before_torch_with_the_real_wheel(argv: list[str]) -> None:
    """With the wheel installed and no CANN, torch's backend autoload imports torch_npu and fails
    unless TORCH_DEVICE_BACKEND_AUTOLOAD=0 is set first: each entry point, in a fresh process whose
    environment lacks it, must set it itself."""
    installed_wheel()
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=env, cwd=DEVICES.parents[1], timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_without_the_guard_torch_does_not_import_beside_the_wheel() -> None:
    """What the test above would miss if it could not fail: torch alone, with no guard, fails."""
    installed_wheel()
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    unguarded = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env, timeout=300)
    assert unguarded.returncode != 0 and "TORCH_DEVICE_BACKEND_AUTOLOAD" in unguarded.stderr
