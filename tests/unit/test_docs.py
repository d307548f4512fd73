"""The README and docs/ stay true to the code: commands, settings, keys, scripts, links.

The README is what a newcomer reads first (at most 250 lines); the rest lives in docs/.
These tests fail when the code grows something the docs do not name (a CLI command, a
setting, a Redis key, a Lua script) or when a doc names something the code lacks.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import typer

from switchboard.cli import app
from switchboard.shared.config import Settings
from switchboard.shared.store.keyspace import GroupKeys, Keyspace

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LUA = ROOT / "src" / "switchboard" / "shared" / "store" / "lua"
README_MAX_LINES = 250


def doc_files() -> list[Path]:
    """The README and every page under docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def cli_commands() -> dict[str, Any]:
    """The `switchboard` commands, from the typer app's click group."""
    group: Any = typer.main.get_command(app)
    return dict(group.commands)


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_readme_fits_a_newcomer() -> None:
    """The README stays within 250 lines."""
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_cli_table_lists_every_command_with_real_options() -> None:
    """Every CLI command has a README table row, and each option named there exists."""
    commands = cli_commands()
    rows = re.findall(r"^\| `switchboard ([a-z-]+)([^`]*)` \|", README.read_text(), re.M)
    assert {name for name, _ in rows} == set(commands)
    for name, usage in rows:
        known = {o for p in commands[name].params for o in p.opts + p.secondary_opts}
        for option in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", usage):
            assert option in known, f"switchboard {name} has no option {option}"


def test_docs_name_only_real_commands() -> None:
    """Every `switchboard <command>` the README and docs/ mention is a CLI command."""
    commands = cli_commands()
    for path in doc_files():
        for name in re.findall(r"`switchboard ([a-z][a-z-]*)", path.read_text()):
            assert name in commands, f"{path.name}: switchboard {name}"


def test_readme_names_every_setting() -> None:
    """Every SWITCHBOARD_* setting is in the README's configuration table."""
    text = README.read_text()
    for field in Settings.model_fields:
        assert f"`SWITCHBOARD_{field.upper()}" in text, field


# Keyspace members that build no key: the slot groups' helpers (`store.slot_groups`).
_NOT_KEYS = frozenset(
    {
        "at",
        "beside",
        "beside_id",
        "every_group",
        "group_of",
        "group_of_id",
        "group_of_key",
        "home",
        "new_id",
        "new_id_beside",
        "one_group_indexes",
        "session_ids_of",
        "updated_agent_match",
    }
)


def test_architecture_lists_every_redis_key() -> None:
    """Every key shape Keyspace builds, and every group's own key (`GroupKeys`), is in
    docs/architecture.md's Redis model."""
    text = (DOCS / "architecture.md").read_text()
    ks = Keyspace()
    for owner, kind in ((ks, Keyspace), (ks.home, GroupKeys)):
        for name, member in inspect.getmembers(kind):
            if name.startswith("_") or name in _NOT_KEYS:
                continue
            if isinstance(member, property):
                key = getattr(owner, name)
            elif inspect.isfunction(member):
                params = list(inspect.signature(member).parameters)[1:]
                key = member(owner, *(f"<{_camel(p)}>" for p in params))
            else:
                continue
            assert f"`{key}`" in text, f"{kind.__name__}.{name} ({key}) is not in the docs"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def test_architecture_lists_every_lua_script() -> None:
    """Every .lua script and include is named in docs/architecture.md (add a row there)."""
    text = (DOCS / "architecture.md").read_text()
    for path in sorted(LUA.glob("*.lua")) + sorted((LUA / "includes").glob("*.lua")):
        assert f"`{path.stem}`" in text, f"{path.relative_to(LUA)} is not in docs/architecture.md"


def test_relative_links_reach_files_and_headings() -> None:
    """Every relative link in the README and docs/ names a file that exists, and its
    #anchor a heading of that file."""
    for path in doc_files():
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            assert linked.exists(), f"{path.name}: {target}"
            if anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.M)
                assert anchor in {slug(h) for h in headings}, f"{path.name}: {target}"


def _config_table() -> list[tuple[str, str, str]]:
    """(key, default, meaning) of each row of the README's config table."""
    text = README.read_text()
    table = text[text.index("| key | default | meaning |") :].split("\n\n", 1)[0]
    rows = [
        re.split(r"\s*\|\s*", line.strip().strip("|"), maxsplit=2)
        for line in table.splitlines()[2:]
    ]
    return [(key, default, rest) for key, default, rest in rows]


def _documented_defaults() -> dict[str, str]:
    """Dotted key -> the default the README's config table gives it, where it gives a
    literal one: the default column (`a.b / c / d` with `1 / 2 / 3` share a prefix) and the
    `name` N (or name: N) pairs a meaning spells out for a section's fields."""
    found: dict[str, str] = {}
    for key, default, meaning in _config_table():
        keys = [k.strip(" `") for k in key.split(" / ")]
        prefix = keys[0].rsplit(".", 1)[0]
        full = [k if "." in k else f"{prefix}.{k}" for k in keys]
        values = [v.strip(" `") for v in default.split(" / ")] if default else []
        if len(values) == len(full):
            found.update(dict(zip(full, values, strict=True)))
        section = keys[0].removesuffix(".*")
        for quoted, value, named, number in re.findall(
            r"`(\w+)` (\d+)\b|\b(\w+): (\d+)\b", meaning
        ):
            found[f"{section}.{quoted or named}"] = value or number
    return found


def _plain_number(text: str) -> str:
    """A default as the README writes it for people (`50,000`, `200 MB`) as the model holds it."""
    units = {"KB": 1024, "MB": 1024**2, "GB": 1024**3}
    found = re.fullmatch(r"([\d,]+)(?: (KB|MB|GB))?", text)
    if found is None:
        return text
    return str(int(found[1].replace(",", "")) * units.get(found[2] or "", 1))


def _config_value(dump: dict[str, Any], key: str) -> Any:
    value: Any = dump
    for part in key.split("."):
        value = value[part]
    return value


def test_readme_config_defaults_are_the_config_models() -> None:
    """Every literal default the README's config table states is the config model's own."""
    from switchboard.shared.config import BUILTIN_MODEL, SwitchboardConfig

    dump = SwitchboardConfig().model_dump(by_alias=True, mode="json")
    worded = {"allow", "on", "disabled"}  # defaults said in words (no literal to compare)
    checked = 0
    for key, documented in _documented_defaults().items():
        if documented in worded:
            continue
        actual = _config_value(dump, key)
        if actual is None and key == "agents.defaults.model":
            actual = BUILTIN_MODEL  # no model configured: the built-in one
        if isinstance(actual, float) and actual.is_integer():
            actual = int(actual)
        documented = _plain_number(documented)
        assert str(actual) == documented, f"README: {key} defaults to {documented}, not {actual}"
        checked += 1
    assert checked >= 15  # the table's literal defaults, not a parse that found none
