"""Every built-in sink package has the same modules for the same roles, and one way to
translate its client's errors (docs/writing-a-sink.md, "The skeleton").

    config      the typed configuration(s); field docstrings are the option reference
    handles     what a participant's handle carries (HandleDetails)
    errors      translate(exc, step, sink): the sink's one translation of its client's errors
    writer      phase 1: the participant being written and what writes its rows
    committer   phase 2 from a handle alone: commit (or publish) and roll back
    recovery    what a restart finds: leftovers, an epoch's prepared participants, the last
                committed epoch
    operations  what the `durable-sinks` command reads: what is in doubt, what is held
    sink        the sink class, each protocol method handing over to one of the above

A package may add helpers of its own (a layout, a schema shape); these are the ones every
package has."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import durable_sinks.sinks as sinks_package
from durable_sinks.core.sink_base import SinkBase
from durable_sinks.sinks._registry import _BUILT_IN

ROLES = (
    "config",
    "handles",
    "errors",
    "writer",
    "committer",
    "recovery",
    "operations",
    "sink",
)


def _packages() -> list[str]:
    """Each built-in kind's package (two kinds may share one)."""
    found: list[str] = []
    for relative, _extra in _BUILT_IN.values():
        package = sinks_package.__name__ + relative
        if package not in found:
            found.append(package)
    return found


PACKAGES = _packages()


def test_every_built_in_package_is_a_sink_package() -> None:
    under = {
        f"{sinks_package.__name__}.{info.name}"
        for info in pkgutil.iter_modules(sinks_package.__path__)
        if info.ispkg
    }
    assert under == set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_sink_package_has_every_role(package: str) -> None:
    root = importlib.import_module(package)
    modules = {info.name for info in pkgutil.iter_modules(root.__path__)}
    missing = [role for role in ROLES if role not in modules]
    assert not missing, f"{package} lacks the role modules {missing}"


@pytest.mark.parametrize("package", PACKAGES)
def test_one_translate_signature(package: str) -> None:
    errors: ModuleType = importlib.import_module(f"{package}.errors")
    signature = inspect.signature(errors.translate)
    assert list(signature.parameters) == ["exc", "step", "sink"], package
    assert "DurableSinkError | None" in str(signature.return_annotation), package


@pytest.mark.parametrize("package", PACKAGES)
def test_the_sink_translates_through_its_errors_module(package: str) -> None:
    """The sink's `_translate` is the errors module's `translate`, nothing more."""
    sink_module = importlib.import_module(f"{package}.sink")
    classes = [
        value
        for value in vars(sink_module).values()
        if inspect.isclass(value)
        and issubclass(value, SinkBase)
        and value is not SinkBase
        and value.__module__ == sink_module.__name__
    ]
    assert classes, package
    for cls in classes:
        source = inspect.getsource(cls._translate)
        body = [
            line.strip()
            for line in source.splitlines()[1:]
            if line.strip() and not line.strip().startswith(('"""', "#"))
        ]
        assert body[-1] == "return errors.translate(exc, step, self)", (cls, body)


@pytest.mark.parametrize("package", PACKAGES)
def test_the_participant_lives_in_the_writer(package: str) -> None:
    writer = importlib.import_module(f"{package}.writer")
    from durable_sinks.core.sink_base import OpenParticipant

    participants = [
        value
        for value in vars(writer).values()
        if inspect.isclass(value)
        and issubclass(value, OpenParticipant)
        and value.__module__ == writer.__name__
    ]
    assert participants, f"{package}.writer defines no participant class"


def test_sinks_and_stores_log_only_through_the_jobs_logger() -> None:
    """No sink or decision store module takes a plain logger: every line goes through a
    JobLogger (SinkBase.logger, manifest's store_logger), so each carries the job, sink and
    epoch, in its text and in the record's extras."""
    import durable_sinks.manifest as manifest_package

    roots = [Path(sinks_package.__file__).parent, Path(manifest_package.__file__).parent]
    plain = [
        f"{path}:{number}"
        for root in roots
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "logging.getLogger(" in line
    ]
    assert not plain, plain
