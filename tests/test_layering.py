"""The package's architecture, read from its imports: floors that import only downwards, and no circles.

A module may import from its own package and from the packages on floors below its own. The order is
written once, here; a new package gets a floor before it can be imported from.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "hf_jetspec"

# lowest first; packages on one floor do not import each other
FLOORS = (
    ("kernels",),  # tensor math: the fused draft head and its reference, the float32 log-normaliser
    ("drafter",),  # the drafter model: configuration, layers, masks, cache, drafting step, checkpoint formats
    ("data",),  # prompt sets and corpora shipped in packages
    ("policy",),  # cost model, acceptance, verify length, n-gram and output-memory sources
    ("foresight",),  # adapters, decoder, outcome scores, calibration, the pre-drafting engine
    ("training",),  # trainers, labels, regeneration, feature cache, the drafter-alone measurement
    ("assistant",),  # a drafter composed with its companions
    ("generation",),  # the seam, the candidate generator, tree rounds: the loop behind generate
    ("interop", "ctmc", "metrics"),  # serving engines, SpecCTMC, evaluate modules
    ("tools",),  # command line, bench, targets, numerics
)
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}


def module_name(path: Path, src: Path = SRC) -> str:
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, src: Path = SRC) -> list[tuple[str, int]]:
    """Every hf_jetspec module a file imports (at the top or inside a function), with its line;
    ``from package import name`` counts the submodule ``package.name`` where one exists."""
    name = module_name(path, src)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("hf_jetspec"):
                continue
            subs = [f"{target}.{alias.name}" for alias in node.names if exists(f"{target}.{alias.name}", src)]
            found += [(t, node.lineno) for t in subs or [target]]
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name.startswith("hf_jetspec")]
    return found


def exists(module: str, src: Path = SRC) -> bool:
    path = src.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the root, hf_jetspec itself


def import_graph() -> dict[str, list[tuple[str, int]]]:
    return {module_name(p): imported_modules(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_package_has_a_floor():
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages == set(FLOOR), f"packages without a floor: {packages - set(FLOOR)}; floors without a package: {set(FLOOR) - packages}"


def test_no_module_imports_from_a_floor_above_its_own():
    upward = []
    for module, imports in import_graph().items():
        mine = package_of(module)
        if mine is None:
            continue  # the root module composes the public API from every floor
        for target, line in imports:
            theirs = package_of(target)
            if theirs == mine:
                continue
            if theirs is None or FLOOR[theirs] >= FLOOR[mine]:
                upward.append(f"{module}:{line} imports {target} ({theirs or 'the root'} is not below {mine})")
    assert not upward, "imports that run up or sideways:\n" + "\n".join(upward)


def test_no_import_circles():
    graph = {m: sorted({t for t, _ in imports if t != m}) for m, imports in import_graph().items()}
    # a package's __init__ importing its own modules is how packages are built; only module circles count
    state, stack, circles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in graph.get(node, []):
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_layering_check_sees_a_lazy_import_of_a_submodule(tmp_path):
    """The check itself: an import inside a function, of a name that is a submodule, is seen as that module."""
    fake = tmp_path / "hf_jetspec"
    for rel in ("__init__.py", "drafter/__init__.py", "policy/__init__.py", "policy/acceptance.py"):
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text("")
    (fake / "drafter" / "modeling_drafter.py").write_text("def f():\n    from ..policy import acceptance\n")
    found = imported_modules(fake / "drafter" / "modeling_drafter.py", tmp_path)
    assert found == [("hf_jetspec.policy.acceptance", 2)]
    assert FLOOR[package_of(found[0][0])] > FLOOR["drafter"]
