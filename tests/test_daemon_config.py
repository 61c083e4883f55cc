"""controller.yaml: validation errors name the field; docs and the example list every field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from controller.daemon.config import ConfigError, ControllerConfig, load_config, parse_config

ROOT = Path(__file__).resolve().parents[1]


def test_embedded_default_runs_a_simulated_server():
    cfg = load_config(None)
    assert cfg.schedule.clock == "simulated"
    assert all(t.simulated is not None for t in cfg.targets)


def test_top_level_example_is_valid():
    cfg = load_config(ROOT / "controller.yaml")
    assert cfg.targets[0].url is not None and cfg.schedule.clock == "wall"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"targets": [{"name": "a", "url": "localhost:30000"}]}, "targets[0]: Value"),
        ({"targets": [{"name": "a", "urll": "http://x"}]}, "targets[0].urll: unknown field"),
        ({"targets": [{"name": "a", "url": "http://x", "timeout_s": -1}]}, "targets[0].timeout_s"),
        ({"targets": []}, "targets: List should have at least 1 item"),
        (
            {"targets": [{"name": "a", "url": "http://x"}], "guardrails": {"rollback_drop": 2}},
            "guardrails.rollback_drop",
        ),
        (
            {"targets": [{"name": "a", "url": "http://x", "source": "prometheus"}]},
            "set prometheus_url",
        ),
        (
            {"targets": [{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}]},
            "repeated: a",
        ),
    ],
)
def test_config_errors_name_the_field(data, expected):
    with pytest.raises(ConfigError) as err:
        parse_config(data, "controller.yaml")
    msg = str(err.value)
    assert msg.startswith("controller.yaml: ")
    assert expected.replace("Value", "") in msg


def test_url_error_says_what_to_write():
    with pytest.raises(ConfigError, match=r"targets\[0\]: url 'localhost:30000' has no scheme: add http://"):
        parse_config({"targets": [{"name": "a", "url": "localhost:30000"}]})
    with pytest.raises(ConfigError, match=r"targets\[0\]: url must start with http:// or https://"):
        parse_config({"targets": [{"name": "a", "url": "ftp://localhost:30000"}]})


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def _fields(model: type[BaseModel]) -> set[str]:
    out = set()
    for name, info in model.model_fields.items():
        out.add(name)
        ann = info.annotation
        for sub in getattr(ann, "__args__", ()) or (ann,):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                out |= _fields(sub)
            args = getattr(sub, "__args__", ())
            for a in args:
                if isinstance(a, type) and issubclass(a, BaseModel):
                    out |= _fields(a)
    return out


def test_every_field_is_documented_in_docs_and_example():
    # The reference (docs/daemon.md) or the operator guide (docs/operate.md) documents it.
    docs = "".join((ROOT / "docs" / page).read_text() for page in ("daemon.md", "operate.md"))
    example = (ROOT / "controller.yaml").read_text()
    for name in _fields(ControllerConfig):
        assert re.search(rf"`{name}`", docs), f"docs/daemon.md does not document `{name}`"
        assert re.search(rf"\b{name}:", example), f"controller.yaml does not show `{name}`"
