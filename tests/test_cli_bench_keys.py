"""Keys and roles of the servers `specctl bench` and `specctl status` talk to, over loopback
against served simulators: the API key on every ordinary request (the admin key on the admin
ones), a refused key named in one line, a server that cannot play the role it was given."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller.cli import COMMAND_MODULES, app

for _module in COMMAND_MODULES:
    importlib.import_module(_module)

ADMIN, API = "admin-k", "api-secret"
FAST = ["--depths", "0,3", "--concurrency", "1", "--requests-per-level", "5",
        "--output-tokens", "8", "--prompt-tokens", "16", "--client-bound-share", "100"]  # fmt: skip


def flat(text: str) -> str:
    return " ".join(text.split())


def run(*args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    # An empty variable is no key (typer reads the environment for --api-key/--admin-key).
    return CliRunner().invoke(app, list(args), env={"SPECCTL_API_KEY": "",
                                                    "SPECCTL_ADMIN_KEY": "", **(env or {})})


GUARDED = {"admin_key": ADMIN, "api_key": API, "speedup": 100, "record": True}


@pytest.mark.parametrize("sim_server", [GUARDED], indirect=True)
def test_bench_sends_the_api_key_on_every_ordinary_request_and_the_admin_key_on_pushes(
    sim_server, tmp_path: Path
) -> None:
    url = sim_server.base_url
    res = run("bench", "--url", url, "--admin-key", ADMIN, "--api-key", API, *FAST,
              "--header", "X-Route:blue", "--out", str(tmp_path))  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert [r["series"] for r in rows] == ["d0", "d3"] and all(r["requests"] >= 5 for r in rows)
    by_path: dict[str, set[str]] = {}
    for path, headers in sim_server.post_headers:
        by_path.setdefault(path, set()).add(headers.get("authorization", ""))
        assert headers.get("x-route") == "blue", path  # --header goes with every request
    assert by_path["/v1/completions"] == {f"Bearer {API}"}
    assert by_path["/set_internal_state"] == {f"Bearer {ADMIN}"}


@pytest.mark.parametrize("sim_server", [GUARDED], indirect=True)
def test_the_api_key_comes_from_specctl_api_key_too(sim_server, tmp_path: Path) -> None:
    res = run("bench", "--url", sim_server.base_url, *FAST, "--out", str(tmp_path),
              env={"SPECCTL_API_KEY": API, "SPECCTL_ADMIN_KEY": ADMIN})  # fmt: skip
    assert res.exit_code == 0, res.output
    status = run("status", "--url", sim_server.base_url, "--window", "0.5",
                 env={"SPECCTL_API_KEY": API})  # fmt: skip
    assert status.exit_code == 0, status.output


@pytest.mark.parametrize("sim_server", [GUARDED], indirect=True)
def test_a_missing_or_wrong_api_key_is_one_line_naming_it_and_exit_2(
    sim_server, tmp_path: Path
) -> None:
    url = sim_server.base_url
    missing = run("bench", "--url", url, "--admin-key", ADMIN, *FAST, "--out", str(tmp_path))
    assert missing.exit_code == 2
    assert missing.output.strip() == (
        f"error: {url}/server_info answered 401 Unauthorized: it needs the server's --api-key: "
        "pass --api-key or set SPECCTL_API_KEY"
    )
    wrong = run("bench", "--url", url, "--admin-key", ADMIN, "--api-key", "nope", *FAST,
                "--out", str(tmp_path))  # fmt: skip
    assert wrong.exit_code == 2
    assert "the API key given (--api-key) was refused" in flat(wrong.output)
    assert not list(tmp_path.iterdir())  # nothing ran, nothing was written
    status = run("status", "--url", url, "--window", "0.5")
    assert status.exit_code == 2
    assert status.output.strip() == (
        f"error: {url}/server_info answered 401 Unauthorized: it needs the server's --api-key: "
        "pass --api-key or set SPECCTL_API_KEY"
    )


def test_a_server_without_speculation_is_refused_in_one_line(
    sim_server_factory, tmp_path: Path
) -> None:
    """It used to run nothing, print `depths []` and exit 0 with an empty folder."""
    plain = sim_server_factory(speculative=False, speedup=100)
    out = tmp_path / "b"
    res = run("bench", "--url", plain.base_url, "--concurrency", "1", "--out", str(out))
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"error: --url {plain.base_url}: the server reports no speculative algorithm "
        "(speculative_algorithm is null), so there are no depths to sweep; bench a server "
        "without speculation as --no-spec-url beside a speculative --url, or start a "
        "speculative one with `specctl serve`"
    )
    assert not out.exists()


def test_a_speculative_server_as_no_spec_url_is_refused(sim_server_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = sim_server_factory(admin_key=ADMIN, speedup=100)
    other = sim_server_factory(speedup=100)
    out = tmp_path / "b"
    itself = run("bench", "--url", spec.base_url, "--admin-key", ADMIN, "--no-spec-url",
                 spec.base_url + "/", *FAST, "--out", str(out))  # fmt: skip
    assert itself.exit_code == 2
    assert itself.output.strip() == (
        f"error: --no-spec-url {spec.base_url}/ is --url itself: give a second server, "
        "started without speculative decoding, to compare against"
    )
    twin = run("bench", "--url", spec.base_url, "--admin-key", ADMIN, "--no-spec-url",
               other.base_url, *FAST, "--out", str(out))  # fmt: skip
    assert twin.exit_code == 2
    assert twin.output.strip() == (
        f"error: --no-spec-url {other.base_url}: that server runs speculative decoding "
        "(speculative_algorithm EAGLE3), so the comparison would be speculation against "
        "speculation; give a server started without --speculative-algorithm (or `specctl sim "
        "serve --no-speculative`)"
    )
    assert not out.exists() and spec.server.specctl_state()["version"] == 0


@pytest.mark.parametrize("sim_server", [{"admin_key": ADMIN, "speedup": 100, "record": True}],
                         indirect=True)  # fmt: skip
def test_the_chat_endpoint_with_extra_body_fields(sim_server, tmp_path: Path) -> None:
    res = run("bench", "--url", sim_server.base_url, "--admin-key", ADMIN, *FAST,
              "--endpoint", "chat", "--extra-request-body", '{"top_p": 0.5, "max_tokens": 12}',
              "--out", str(tmp_path))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert not [p for p, _ in sim_server.posts if p == "/v1/completions"]
    # a request the bench cancelled at a level's end before the server read its body has none
    chats = [body for path, body in sim_server.posts
             if path == "/v1/chat/completions" and body is not None]
    measured = [b for b in chats if b["max_tokens"] != 2]  # not the unmeasured warm-up
    assert measured and all(b["top_p"] == 0.5 and b["max_tokens"] == 12 for b in measured)
    assert all(b["messages"][-1]["role"] == "user" for b in chats)
    rows = json.loads((tmp_path / "bench.json").read_text())["results"]
    # The extra body's max_tokens won over --output-tokens 8, and every token was counted.
    assert all(r["output_tokens_min"] == r["output_tokens_max"] == 12 for r in rows)
    assert "/v1/chat/completions + max_tokens, top_p (--extra-request-body)" in flat(res.output)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--header", "NoValue"], "error: --header: 'NoValue': expected NAME:VALUE"),
        (["--header", "Authorization: Bearer x"], "give the server's key with --api-key"),
        (["--extra-request-body", "[1]"], "error: --extra-request-body: must be a JSON object"),
        (["--extra-request-body", "{top_p: 1}"], "error: --extra-request-body: not valid JSON"),
        (["--endpoint", "embeddings"], "error: --endpoint: 'embeddings': give completions or chat"),
        (["--percentiles", "50,100"], "error: --percentiles: 100 is out of range"),
        (["--gsp-groups", "4"], "error: --gsp-groups: shapes the generated-shared-prefix dataset"),
        (["--dataset", "random-ids", "--endpoint", "chat"], "only through the model's tokenizer"),
        (["--tokenizer", "/nonexistent/tok"], "error: --tokenizer /nonexistent/tok: no such file"),
    ],
)
def test_bad_request_options_are_one_line_naming_the_option(args: list[str], message: str) -> None:
    res = run("bench", "--url", "http://127.0.0.1:9", "--admin-key", "k", *args)
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert message in res.output


@pytest.mark.parametrize("sim_server", [GUARDED], indirect=True)
def test_load_processes_send_the_api_key_and_headers_too(sim_server, tmp_path: Path) -> None:
    res = run("bench", "--url", sim_server.base_url, "--admin-key", ADMIN, "--api-key", API,
              "--depths", "1", "--concurrency", "2", "--requests-per-level", "5",
              "--output-tokens", "8", "--prompt-tokens", "16", "--client-bound-share", "100",
              "--client-processes", "2", "--header", "X-Route=green",
              "--out", str(tmp_path))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "load split across 2 client processes" in flat(res.output)
    sent = [h for path, h in sim_server.post_headers if path == "/v1/completions"]
    assert len(sent) >= 5
    assert all(h.get("authorization") == f"Bearer {API}" and h.get("x-route") == "green"
               for h in sent)  # fmt: skip


@pytest.mark.parametrize("sim_server", [GUARDED], indirect=True)
def test_release_takes_the_api_key_for_its_reads(sim_server) -> None:
    url = sim_server.base_url
    missing = run("release", "--url", url, "--admin-key", ADMIN)
    assert missing.exit_code == 2
    assert missing.output.strip() == (
        f"error: {url}/server_info answered 401 Unauthorized: it needs the server's --api-key: "
        "pass --api-key or set SPECCTL_API_KEY"
    )
    released = run("release", "--url", url, "--admin-key", ADMIN, "--api-key", API)
    assert released.exit_code == 0, released.output
    assert "already released, nothing pushed" in released.output
