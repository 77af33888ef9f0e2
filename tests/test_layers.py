"""The dependency direction of docs/architecture.md, read from the source: every import
(at the top of a module or inside a function) points to a module of the same layer or a
lower one, and no two modules import each other, however indirectly."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("queue_schemas", "kernels", "worker", "producer_api", "genfleet")

# Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: list[tuple[str, ...]] = [
    ("queue_schemas",),
    ("kernels",),
    # The engine's public, torch-free faces and what they need.
    (
        "worker.config",
        "worker.device",
        "worker.model_fetch",
        "worker.outputs",
        "worker.sampling_params",
    ),
    ("worker.models",),
    # The step's state and sampling.
    (
        "worker.sampling",
        "worker.engine.sequence",
        "worker.engine.block_manager",
        "worker.engine.scheduler",
        "worker.engine.detokenizer",
        "worker.engine.output_processor",
        "worker.engine.generation_config",
        "worker.engine.tokenizer",
        "worker.engine.admission",
    ),
    ("worker.execution",),
    ("worker.spec_decode",),
    # The loop itself and the offline API.
    ("worker.engine", "worker.llm", "worker"),
    ("worker.engine_process",),
    ("worker.service",),
    # The API: schemas, then stores, then services, then routes and the app.
    (
        "producer_api.settings",
        "producer_api.errors",
        "producer_api.metrics",
        "producer_api.schemas",
        "producer_api.auth",
        "producer_api.body_limit",
    ),
    ("producer_api.stores",),
    ("producer_api.services",),
    ("producer_api.dependencies",),
    ("producer_api.routes", "producer_api.batch_runner"),
    ("producer_api.app", "producer_api"),
    ("genfleet",),
]
# What the engine process's client side may be imported by: the asyncio service.
SERVICE_MAY_IMPORT = (
    "queue_schemas",
    "worker.config",
    "worker.device",
    "worker.outputs",
    "worker.engine_process.client",
    "worker.engine_process.protocol",
    "worker.engine_process.threads",
    "worker.service",
)


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


MODULES = _modules()


def _target(name: str) -> str | None:
    """The module ``name`` names (``package.module.attribute`` -> ``package.module``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in map(_target, names) if t is not None and t != module)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def layer_of(module: str) -> int:
    best, best_length = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            named = module == prefix or module.startswith(prefix + ".")
            if named and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    assert best >= 0, f"{module} is in no layer"
    return best


def test_every_import_points_to_its_own_layer_or_a_lower_one() -> None:
    upward = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "imports that run back up:\n" + "\n".join(sorted(upward))


def test_no_module_imports_itself_through_others() -> None:
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("worker.service")))
def test_the_service_imports_only_the_engine_process_client_side(module: str) -> None:
    outside = [
        target
        for target in GRAPH[module]
        if not target.startswith(SERVICE_MAY_IMPORT) and target.split(".")[0] != "genfleet"
    ]
    assert not outside, f"{module} imports {outside}"


def test_the_api_imports_neither_the_engine_nor_the_command_line() -> None:
    wrong = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.startswith("producer_api")
        for target in targets
        if not target.startswith(("producer_api", "queue_schemas"))
    ]
    assert not wrong, wrong


def test_the_layering_test_sees_an_upward_import() -> None:
    """The checks above read real imports: one that runs back up is found."""
    assert layer_of("worker.engine.scheduler") < layer_of("worker.execution.model_runner")
    assert "worker.engine.scheduler" in GRAPH["worker.execution.model_runner"]
    assert layer_of("producer_api.stores.jobs") < layer_of("producer_api.services.fleet")


def test_the_engine_reaches_kernels_only_through_their_dispatch() -> None:
    """``kernels.dispatch`` (re-exported by ``kernels``) is the one place that picks an
    implementation: no engine module imports one itself."""
    allowed = {"kernels", "kernels.dispatch", "kernels.quantized_weight"}
    direct = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.startswith("worker")
        for target in targets
        if target.startswith("kernels") and target not in allowed
    ]
    assert not direct, direct
