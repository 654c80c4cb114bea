"""The apply tool and the verifier on purpose-built trees and patches (real GNU patch)."""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3090 import patchtool
from qwen3090.manifest import load_manifest
from tests.support.fakevllm import make_tree, numbered, write_overlay, write_patch, write_series

pytestmark = pytest.mark.unit

MOD = "vllm/mod.py"
BASE = numbered(30)


def _apply(root: Path, patches: Path) -> Path:
    return patchtool.apply_series(root, patchtool.load_series(patches), log=False)


def _status(root: Path, patches: Path) -> dict[str, str]:
    report = patchtool.verify_tree(root, patchtool.load_series(patches))
    return {p.name: p.status for p in report.patches}


def _replace(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


# --------------------------------------------------------------------------- headers/series


def test_header_block_is_parsed(tmp_path: Path) -> None:
    write_patch(
        tmp_path,
        "knobs",
        {MOD: (BASE, _replace(BASE, "line_3 = 3", "line_3 = 33"))},
        provides="# provides-env: VLLM_A, VLLM_B\n# provides-env: VLLM_C\n"
        "# provides-flag: --foo-bar --baz=qux\n# provides-feature: fast-thing\n",
    )
    patch = patchtool.load_patch(tmp_path / "knobs.patch")
    assert patch.header.env == ("VLLM_A", "VLLM_B", "VLLM_C")
    assert patch.header.flags == ("--foo-bar", "--baz=qux")
    assert patch.header.features == ("fast-thing",)
    assert patch.files == (MOD,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("# qwen3090-patch: other\n# summary: s\n# why: w\n", "file stem is 'p'"),
        ("# qwen3090-patch: p\n# why: w\n", "lacks '# summary"),
        ("# qwen3090-patch: p\n# summary: s\n# why: w\n# provides-envs: X\n", "unknown header key"),
    ],
)
def test_bad_headers_are_refused(tmp_path: Path, text: str, message: str) -> None:
    body = "--- a/vllm/mod.py\n+++ b/vllm/mod.py\n@@ -1 +1 @@\n-a\n+b\n"
    (tmp_path / "p.patch").write_text(text + body)
    with pytest.raises(patchtool.PatchToolError, match=message):
        patchtool.load_patch(tmp_path / "p.patch")


def test_unlisted_patch_file_is_named(tmp_path: Path) -> None:
    write_patch(tmp_path, "one", {MOD: (BASE, BASE + "x = 1\n")})
    write_patch(tmp_path, "stray", {MOD: (BASE, BASE + "y = 1\n")})
    write_series(tmp_path, ["one"])
    with pytest.raises(patchtool.PatchToolError, match=r"stray\.patch is not listed"):
        patchtool.load_series(tmp_path)


def test_listed_but_missing_patch_is_named(tmp_path: Path) -> None:
    write_patch(tmp_path, "one", {MOD: (BASE, BASE + "x = 1\n")})
    write_series(tmp_path, ["one", "ghost"])
    with pytest.raises(patchtool.PatchToolError, match=r"series lists ghost\.patch"):
        patchtool.load_series(tmp_path)


def test_series_digest_follows_patch_content(tmp_path: Path) -> None:
    write_patch(tmp_path, "one", {MOD: (BASE, BASE + "x = 1\n")})
    write_series(tmp_path, ["one"])
    first = patchtool.load_series(tmp_path).digest
    assert first == patchtool.load_series(tmp_path).digest
    write_patch(tmp_path, "one", {MOD: (BASE, BASE + "x = 2\n")})
    assert patchtool.load_series(tmp_path).digest != first


def test_patch_creating_a_backup_file_is_refused(tmp_path: Path) -> None:
    # Gotcha 54's junk: a section that creates an .orig copy of upstream source.
    write_patch(tmp_path, "junk", {MOD: (BASE, BASE + "x = 1\n"), MOD + ".orig": (None, BASE)})
    with pytest.raises(patchtool.PatchToolError, match=r"mod\.py\.orig.*gotcha 54"):
        patchtool.load_patch(tmp_path / "junk.patch")


# --------------------------------------------------------------------------- apply


def test_rejected_hunk_fails_naming_patch_and_hunk(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE})
    patches = tmp_path / "patches"
    edited = _replace(_replace(BASE, "line_3 = 3", "line_3 = 33"), "line_25 = 25", "line_25 = 0")
    write_patch(patches, "good", {MOD: (BASE, BASE + "tail = 1\n")})
    write_patch(patches, "bad", {MOD: (BASE.replace("line_25 = 25", "drifted = 25"), edited)})
    write_series(patches, ["good", "bad"])
    with pytest.raises(patchtool.PatchToolError) as err:
        _apply(tree, patches)
    message = str(err.value)
    assert "bad.patch" in message
    assert "vllm/mod.py: hunk #2 FAILED" in message
    assert "@@ -22,7 +22,7 @@" in message
    # The failing patch left its file as the previous patch made it; no manifest was written.
    assert (tree / MOD).read_text() == BASE + "tail = 1\n"
    assert not (tree / "vllm/_qwen3090/manifest.json").exists()
    assert not list(tree.rglob("*.rej")) and not list(tree.rglob("*.orig"))


def test_offset_is_a_failure(tmp_path: Path) -> None:
    # The patch was written against a file two lines shorter: GNU patch would happily apply
    # it "with offset 2 lines"; the series must not.
    tree = make_tree(tmp_path / "tree", {MOD: "import os\nimport sys\n" + BASE})
    patches = tmp_path / "patches"
    write_patch(patches, "shifted", {MOD: (BASE, _replace(BASE, "line_9 = 9", "line_9 = 99"))})
    write_series(patches, ["shifted"])
    with pytest.raises(patchtool.PatchToolError, match=r"shifted\.patch.*\n.*hunk #1 succeeded.*"
                       r"offset 2 lines"):
        _apply(tree, patches)
    assert "line_9 = 9\n" in (tree / MOD).read_text()


def test_fuzz_is_a_failure(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: _replace(BASE, "line_7 = 7", "line_7 = 70")})
    patches = tmp_path / "patches"
    write_patch(patches, "fuzzy", {MOD: (BASE, _replace(BASE, "line_9 = 9", "line_9 = 99"))})
    write_series(patches, ["fuzzy"])
    with pytest.raises(patchtool.PatchToolError, match=r"fuzzy\.patch[\s\S]*hunk #1 FAILED"):
        _apply(tree, patches)


def test_version_mismatch_is_refused_and_not_applicable(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE}, version="0.27.1")
    patches = tmp_path / "patches"
    write_patch(patches, "p", {MOD: (BASE, BASE + "x = 1\n")})
    write_series(patches, ["p"])
    with pytest.raises(patchtool.PatchToolError, match=r"holds vLLM 0\.27\.1"):
        _apply(tree, patches)
    assert _status(tree, patches) == {"p": "not-applicable"}


def test_apply_writes_manifest_and_store_and_refuses_a_second_run(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE})
    patches = tmp_path / "patches"
    write_patch(
        patches,
        "adds",
        {MOD: (BASE, BASE + "x = 1\n"), "vllm/extra.py": (None, "VALUE = 7\n")},
        provides="# provides-env: VLLM_X\n# provides-flag: --x\n# provides-feature: ex\n",
    )
    write_series(patches, ["adds"])
    manifest_path = _apply(tree, patches)
    manifest = load_manifest(manifest_path)
    series = patchtool.load_series(patches)
    assert manifest.series_digest == series.digest
    assert manifest.vllm_version == "0.28.0"
    assert manifest.provided_env == frozenset({"VLLM_X"})
    assert manifest.provided_flags == frozenset({"--x"})
    assert manifest.provided_features == frozenset({"ex"})
    record = manifest.patches[0]
    assert record.files == (MOD, "vllm/extra.py")
    assert record.creates == ("vllm/extra.py",)
    assert record.sha256 == patchtool.sha256_file(patches / "adds.patch")
    store = tree / "vllm/_qwen3090"
    assert (store / "series").read_text() == (patches / "series").read_text()
    assert (store / "adds.patch").read_bytes() == (patches / "adds.patch").read_bytes()
    # The stored copy alone verifies the tree.
    assert _status(tree, store) == {"adds": "applied"}
    with pytest.raises(patchtool.PatchToolError, match="already patched"):
        _apply(tree, patches)


# --------------------------------------------------------------------------- pyc staleness


def _load_value(tree: Path) -> str:
    code = "import vllm.mod as m; print(m.VALUE)"
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True,
                          text=True, check=True)
    return proc.stdout.strip()


def _edit_keeping_stat(path: Path, old: str, new: str) -> None:
    # Same size and same mtime: exactly what an mtime-trusting pyc cannot notice (gotcha 22).
    assert len(old) == len(new)
    st = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("mode", ["timestamp", "checked-hash"])
def test_stale_pyc_cannot_be_loaded_after_a_source_edit(tmp_path: Path, mode: str) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: "VALUE = 'old'\n"})
    patches = tmp_path / "patches"
    write_patch(patches, "p", {MOD: ("VALUE = 'old'\n", "VALUE = 'one'\n")})
    write_series(patches, ["p"])
    _apply(tree, patches)
    pyc = Path(importlib.util.cache_from_source(str(tree / MOD)))
    assert pyc.is_file()
    if mode == "timestamp":
        # The control: what pip and rsync'd trees have. Proves the edit below is one a
        # timestamp pyc cannot see, so the checked-hash case is a real test.
        py_compile.compile(str(tree / MOD), cfile=str(pyc),
                           invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    assert _load_value(tree) == "one"
    _edit_keeping_stat(tree / MOD, "'one'", "'two'")
    expected = "one" if mode == "timestamp" else "two"
    assert _load_value(tree) == expected


def test_every_pyc_is_checked_hash(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE, "vllm/sub/other.py": "A = 1\n"})
    stale = tree / "vllm/sub/__pycache__/old.cpython-311.opt-1.pyc"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"junk")
    patches = tmp_path / "patches"
    write_patch(patches, "p", {MOD: (BASE, BASE + "x = 1\n")})
    write_series(patches, ["p"])
    _apply(tree, patches)
    pycs = list(tree.rglob("*.pyc"))
    assert len(pycs) == 4  # __init__, _version, mod, sub/other
    for pyc in pycs:
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
        assert flags == 0b11, f"{pyc} is not a checked-hash pyc (flags {flags})"
    assert not stale.exists()


# --------------------------------------------------------------------------- verify


def test_verifier_reports_applied_and_not_applied(tmp_path: Path) -> None:
    pristine = make_tree(tmp_path / "pristine", {MOD: BASE})
    patched = make_tree(tmp_path / "patched", {MOD: BASE})
    patches = tmp_path / "patches"
    write_patch(patches, "p", {MOD: (BASE, _replace(BASE, "line_5 = 5", "line_5 = 55"))})
    write_series(patches, ["p"])
    _apply(patched, patches)
    assert _status(pristine, patches) == {"p": "not-applied"}
    assert _status(patched, patches) == {"p": "applied"}


def test_gotcha_54_created_file_deleted_is_reported_honestly(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE, "vllm/unrelated.py": "Z = 1\n"})
    patches = tmp_path / "patches"
    write_patch(patches, "lookup", {MOD: (BASE, BASE + "from vllm.helper import H\n"),
                                    "vllm/helper.py": (None, "H = 1\n")})
    write_series(patches, ["lookup"])
    _apply(tree, patches)
    # Cleanups that touch files no patch owns (backups, bytecode, unrelated modules) must not
    # change the verdict: the old verifier demanded such files.
    (tree / "vllm/mod.py.orig").write_text(BASE)
    (tree / "vllm/mod.py.orig").unlink()
    (tree / "vllm/unrelated.py").unlink()
    for cache in tree.rglob("__pycache__"):
        shutil.rmtree(cache)
    assert _status(tree, patches) == {"lookup": "applied"}
    # Now delete what the patch really owns: the edit is still there, its file is not.
    (tree / "vllm/helper.py").unlink()
    report = patchtool.verify_tree(tree, patchtool.load_series(patches))
    result = report.patches[0]
    assert result.status == "partial"
    by_path = {f.path: f for f in result.files}
    assert by_path[MOD].applied
    assert not by_path["vllm/helper.py"].applied
    assert "missing: this patch creates it" in by_path["vllm/helper.py"].detail
    assert not report.ok


def test_two_patches_on_the_same_hunk_region_are_both_applied(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE})
    pristine = make_tree(tmp_path / "pristine", {MOD: BASE})
    patches = tmp_path / "patches"
    after_a = _replace(BASE, "line_10 = 10\nline_11 = 11\n", "line_10 = 'A'\nline_11 = 'A'\n")
    # B edits the line right after A's edit and inserts two lines above it, so A's hunk no
    # longer matches the final tree (context changed) and any A hunk below would be offset.
    after_b = _replace(after_a, "line_12 = 12", "line_12 = 'B'")
    after_b = _replace(after_b, "line_2 = 2\n", "line_2 = 2\nb_1 = 1\nb_2 = 2\n")
    write_patch(patches, "a", {MOD: (BASE, after_a)})
    write_patch(patches, "b", {MOD: (after_a, after_b)})
    write_series(patches, ["a", "b"])
    _apply(tree, patches)
    assert (tree / MOD).read_text() == after_b
    # The premise: A's reverse alone does not apply exactly to the final tree.
    direct = patchtool.run_gnu_patch(tree, patchtool.load_patch(patches / "a.patch").
                                     sections[0].text, reverse=True)
    assert not direct.ok
    report = patchtool.verify_tree(tree, patchtool.load_series(patches))
    assert {p.name: p.status for p in report.patches} == {"a": "applied", "b": "applied"}
    assert "once the later patches touching this file are undone (b)" in \
        report.patches[0].files[0].detail
    assert _status(pristine, patches) == {"a": "not-applied", "b": "not-applied"}
    # Only A on the tree: A applied, B not (the fallback must not credit B's absence to A).
    only_a = make_tree(tmp_path / "only_a", {MOD: after_a})
    assert _status(only_a, patches) == {"a": "applied", "b": "not-applied"}


def test_comment_only_patch_is_not_fooled_by_offset_matches(tmp_path: Path) -> None:
    # A comment-only patch has no removed lines and changes no bytecode, so a verifier that
    # checks "removed lines are gone", compares code objects, or accepts GNU patch's offset
    # matches calls it applied on a pristine tree. Here the exact comment with its context
    # already exists further down the file, so the reverse matches there at an offset.
    block = "x = 1\n# keep in sync with the kernel\ny = 2\n"
    original = "x = 1\ny = 2\n" + numbered(10) + block
    commented = block + numbered(10) + block
    pristine = make_tree(tmp_path / "pristine", {MOD: original})
    patched = make_tree(tmp_path / "patched", {MOD: original})
    patches = tmp_path / "patches"
    write_patch(patches, "comment", {MOD: (original, commented)}, context=1)
    write_series(patches, ["comment"])
    # The trap is real: GNU patch's own verdict (exit status) says the reverse applies.
    text = patchtool.load_patch(patches / "comment.patch").sections[0].text
    loose = subprocess.run(["patch", "-R", "--dry-run", "-p1", "--fuzz=0", "-f", "-d",
                            str(pristine)], input=text, capture_output=True, text=True,
                           check=False)
    assert loose.returncode == 0 and "offset" in loose.stdout
    assert _status(pristine, patches) == {"comment": "not-applied"}
    _apply(patched, patches)
    assert _status(patched, patches) == {"comment": "applied"}
    # And removing the comment again (a revert) is seen, although the code is unchanged.
    (patched / MOD).write_text(original)
    assert _status(patched, patches) == {"comment": "not-applied"}


# --------------------------------------------------------------------------- CLI


def test_cli_verify_exit_status_and_json(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE})
    patches = tmp_path / "patches"
    write_patch(patches, "p", {MOD: (BASE, BASE + "x = 1\n")})
    write_series(patches, ["p"])

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "qwen3090.cli", "verify", "patches", *args],
                              capture_output=True, text=True, check=False)

    before = cli("--vllm-root", str(tree), "--patches", str(patches))
    assert before.returncode == 1
    assert "p  " in before.stdout and "not-applied" in before.stdout
    no_store = cli("--vllm-root", str(tree))
    assert no_store.returncode == 2 and "pass --patches" in no_store.stderr
    _apply(tree, patches)
    after = cli("--vllm-root", str(tree / "vllm"), "--json")  # the package dir works too
    assert after.returncode == 0, after.stderr
    data = json.loads(after.stdout)
    assert data["ok"] is True
    assert data["manifest_series_digest"] == data["series_digest"]
    assert [p["status"] for p in data["patches"]] == ["applied"]


def test_patchtool_is_stdlib_only_and_standalone(tmp_path: Path) -> None:
    # -I -S: no site-packages, no PYTHONPATH, no user site: what a Nix build offers.
    script = Path(patchtool.__file__)
    tree = make_tree(tmp_path / "tree", {MOD: BASE})
    patches = tmp_path / "patches"
    _overlay_series(patches)
    run = [sys.executable, "-I", "-S", str(script)]
    digest = subprocess.run([*run, "digest", "--patches", str(patches)], cwd=tmp_path,
                            capture_output=True, text=True, check=True)
    assert digest.stdout.strip() == patchtool.load_series(patches).digest
    applied = subprocess.run([*run, "apply", "--root", str(tree), "--patches", str(patches)],
                             cwd=tmp_path, capture_output=True, text=True, check=False)
    assert applied.returncode == 0, applied.stderr
    assert "total" in applied.stdout and " s" in applied.stdout
    verified = subprocess.run([*run, "verify", "--root", str(tree)], cwd=tmp_path,
                              capture_output=True, text=True, check=False)
    assert verified.returncode == 0 and "OK: 1 applied" in verified.stdout
    assert (tree / NEW).read_text() == NEW_TEXT


# --------------------------------------------------------------------------- manifest API


def test_find_installed_manifest_locates_the_importable_tree_without_importing(
    tmp_path: Path,
) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE})
    (tree / "vllm/__init__.py").write_text("raise RuntimeError('vllm must not be imported')\n")
    patches = tmp_path / "patches"
    write_patch(patches, "p", {MOD: (BASE, BASE + "x = 1\n")},
                provides="# provides-env: VLLM_P\n")
    write_series(patches, ["p"])
    _apply(tree, patches)
    code = ("from qwen3090.manifest import find_installed_manifest as f; m = f(); "
            "print(m.path, sorted(m.provided_env), m.series_digest)")
    env = {k: v for k, v in os.environ.items() if k != "QWEN3090_MANIFEST"}
    # The package behind the tree: a pip venv has it in site-packages, the Nix check's
    # interpreter (checks.python-tests) only through PYTHONPATH.
    package_root = Path(patchtool.__file__).parents[1]
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                          env=dict(env, PYTHONPATH=os.pathsep.join([str(tree), str(package_root)])),
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    path, provided, digest = proc.stdout.split(" ", 2)
    assert Path(path) == tree / "vllm/_qwen3090/manifest.json"
    assert provided == "['VLLM_P']"
    assert digest.strip() == patchtool.load_series(patches).digest


def test_manifest_override_and_validation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qwen3090.errors import Qwen3090Error
    from qwen3090.manifest import find_installed_manifest

    good = tmp_path / "good.json"
    good.write_text(json.dumps({
        "schema": 1, "vllm_version": "0.28.0", "series_digest": "sha256:ab",
        "patches": [{"name": "n", "file": "n.patch", "sha256": "cd", "files": ["vllm/x.py"],
                     "creates": [], "provides": {"env": ["VLLM_N"], "flags": ["--n"],
                                                 "features": []}}]}))
    monkeypatch.setenv("QWEN3090_MANIFEST", str(good))
    manifest = find_installed_manifest()
    assert manifest is not None
    assert manifest.provided_flags == frozenset({"--n"})
    assert manifest.to_dict() == json.loads(good.read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": 2, "vllm_version": "0.28.0",
                               "series_digest": "sha256:ab", "patches": []}))
    monkeypatch.setenv("QWEN3090_MANIFEST", str(bad))
    with pytest.raises(Qwen3090Error, match="schema 2"):
        find_installed_manifest()
    monkeypatch.setenv("QWEN3090_MANIFEST", str(tmp_path / "absent.json"))
    with pytest.raises(Qwen3090Error, match="cannot read"):
        find_installed_manifest()


# --------------------------------------------------------------------------- overlay

NEW = "vllm/ops/new_kernel.py"
NEW_TEXT = "def kernel() -> int:\n    return 7\n"
ADDS = f"# adds: {NEW}\n"


def _overlay_series(patches: Path) -> None:
    """One patch adding NEW from the overlay and editing MOD to import it."""
    write_overlay(patches, NEW, NEW_TEXT)
    write_patch(patches, "adder", {MOD: (BASE, BASE + "from vllm.ops.new_kernel import kernel\n")},
                provides=ADDS)
    write_series(patches, ["adder"])


def test_overlay_file_is_copied_hashed_and_stored(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE})
    patches = tmp_path / "patches"
    _overlay_series(patches)
    series = patchtool.load_series(patches)
    assert series.patches[0].files == (NEW, MOD)
    manifest_path = _apply(tree, patches)
    assert (tree / NEW).read_bytes() == NEW_TEXT.encode()
    assert (tree / MOD).read_text().endswith("import kernel\n")
    # The patched module really imports the added one.
    code = "import vllm.mod as m; print(m.kernel())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(tree)), check=False)
    assert proc.stdout.strip() == "7", proc.stderr
    record = load_manifest(manifest_path).patches[0]
    assert record.creates == (NEW,)
    raw = json.loads(manifest_path.read_text())["patches"][0]
    overlay_sha = patchtool.sha256_file(patches / "overlay" / NEW)
    assert raw["adds"] == [{"path": NEW, "sha256": overlay_sha}]
    store = tree / "vllm/_qwen3090"
    assert (store / "overlay" / NEW).read_bytes() == NEW_TEXT.encode()
    assert patchtool.load_series(store).digest == series.digest
    assert _status(tree, store) == {"adder": "applied"}
    report = patchtool.verify_tree(tree, series)
    assert [(f.path, f.applied) for f in report.patches[0].files] == [(NEW, True), (MOD, True)]
    assert _status(make_tree(tmp_path / "pristine", {MOD: BASE}), patches) == {
        "adder": "not-applied"}


def test_overlay_only_patch_needs_no_diff(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE})
    patches = tmp_path / "patches"
    write_overlay(patches, NEW, NEW_TEXT)
    write_patch(patches, "only", {}, provides=ADDS)
    write_series(patches, ["only"])
    _apply(tree, patches)
    assert (tree / NEW).read_text() == NEW_TEXT
    assert _status(tree, patches) == {"only": "applied"}


def test_overlay_file_no_header_names_is_refused(tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    _overlay_series(patches)
    write_overlay(patches, "vllm/ops/stray.py", "X = 1\n")
    with pytest.raises(patchtool.PatchToolError, match=r"stray\.py is added by no patch.*"
                       r"'# adds: vllm/ops/stray\.py'"):
        patchtool.load_series(patches)
    # What importing an overlay file leaves behind is nobody's source and is skipped.
    (patches / "overlay/vllm/ops/stray.py").unlink()
    cache = patches / "overlay/vllm/ops/__pycache__"
    cache.mkdir()
    (cache / "new_kernel.cpython-311.pyc").write_bytes(b"junk")
    assert patchtool.load_series(patches).patches[0].header.adds == (NEW,)


def test_named_overlay_file_that_is_missing_is_refused(tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    _overlay_series(patches)
    (patches / "overlay" / NEW).unlink()
    with pytest.raises(patchtool.PatchToolError,
                       match=r"adder\.patch names '# adds: vllm/ops/new_kernel\.py', but .* "
                       "does not exist"):
        patchtool.load_series(patches)


@pytest.mark.parametrize(
    ("adds", "message"),
    [
        ("# adds: ops/new.py\n", "not a relative path under vllm/"),
        ("# adds: vllm/../etc/x.py\n", "not a relative path under vllm/"),
        ("# adds: vllm/x.py.orig\n", "gotcha 54"),
        ("# adds: vllm/x.py\n# adds: vllm/x.py\n", "listed twice"),
        ("# add: vllm/x.py\n", "unknown header key 'add'"),
    ],
)
def test_bad_adds_headers_are_refused(tmp_path: Path, adds: str, message: str) -> None:
    write_patch(tmp_path, "p", {MOD: (BASE, BASE + "x = 1\n")}, provides=adds)
    with pytest.raises(patchtool.PatchToolError, match=message):
        patchtool.load_patch(tmp_path / "p.patch")


def test_added_file_with_its_own_diff_section_or_two_adders_is_refused(tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    write_overlay(patches, NEW, NEW_TEXT)
    write_patch(patches, "both", {NEW: (None, NEW_TEXT)}, provides=ADDS)
    write_series(patches, ["both"])
    with pytest.raises(patchtool.PatchToolError, match="also has a diff section"):
        patchtool.load_series(patches)
    write_patch(patches, "both", {MOD: (BASE, BASE + "x = 1\n")}, provides=ADDS)
    write_patch(patches, "again", {MOD: (BASE + "x = 1\n", BASE + "x = 2\n")}, provides=ADDS)
    write_series(patches, ["both", "again"])
    with pytest.raises(patchtool.PatchToolError, match=r"again\.patch and both\.patch both add"):
        patchtool.load_series(patches)


def test_series_digest_follows_overlay_content(tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    _overlay_series(patches)
    first = patchtool.load_series(patches).digest
    write_overlay(patches, NEW, NEW_TEXT.replace("7", "8"))
    changed = patchtool.load_series(patches).digest
    assert changed != first
    write_overlay(patches, NEW, NEW_TEXT)
    assert patchtool.load_series(patches).digest == first


def test_apply_refuses_an_added_file_that_exists(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE, NEW: "ALREADY = 1\n"})
    patches = tmp_path / "patches"
    _overlay_series(patches)
    with pytest.raises(patchtool.PatchToolError, match=r"creates vllm/ops/new_kernel\.py, which "
                       "already exists"):
        _apply(tree, patches)
    assert (tree / NEW).read_text() == "ALREADY = 1\n"
    assert (tree / MOD).read_text() == BASE


def test_failing_diff_leaves_no_added_file(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE.replace("line_1 = 1", "drifted = 1")})
    patches = tmp_path / "patches"
    write_overlay(patches, NEW, NEW_TEXT)
    write_patch(patches, "adder", {MOD: (BASE, _replace(BASE, "line_2 = 2", "line_2 = 22"))},
                provides=ADDS)
    write_series(patches, ["adder"])
    with pytest.raises(patchtool.PatchToolError, match="does not apply exactly"):
        _apply(tree, patches)
    assert not (tree / NEW).exists()


def test_modified_or_missing_overlay_file_fails_verify(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE})
    patches = tmp_path / "patches"
    _overlay_series(patches)
    _apply(tree, patches)
    # One byte changed, same size: only a byte comparison sees it.
    (tree / NEW).write_text(NEW_TEXT.replace("7", "9"))
    report = patchtool.verify_tree(tree, patchtool.load_series(patches))
    result = report.patches[0]
    assert result.status == "partial" and not report.ok
    by_path = {f.path: f for f in result.files}
    assert by_path[MOD].applied and not by_path[NEW].applied
    assert "differs from overlay/vllm/ops/new_kernel.py" in by_path[NEW].detail
    cli = subprocess.run([sys.executable, "-I", "-S", patchtool.__file__, "verify", "--root",
                          str(tree)], capture_output=True, text=True, check=False)
    assert cli.returncode == 1 and "NOT OK: 1 partial" in cli.stdout, cli.stdout + cli.stderr
    (tree / NEW).unlink()
    detail = patchtool.verify_tree(tree, patchtool.load_series(patches)).patches[0].files[0]
    assert detail.path == NEW and "missing: this patch adds it" in detail.detail


def test_later_patch_editing_an_added_file_verifies_both(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {MOD: BASE})
    patches = tmp_path / "patches"
    _overlay_series(patches)
    edited = NEW_TEXT + "def other() -> int:\n    return 8\n"
    write_patch(patches, "edit", {NEW: (NEW_TEXT, edited)})
    write_series(patches, ["adder", "edit"])
    _apply(tree, patches)
    assert (tree / NEW).read_text() == edited
    report = patchtool.verify_tree(tree, patchtool.load_series(patches))
    assert {p.name: p.status for p in report.patches} == {"adder": "applied", "edit": "applied"}
    assert "once the later patches touching this file are undone (edit)" in \
        report.patches[0].files[0].detail
    # The later edit reverted by hand: the file equals the overlay again, "edit" is gone.
    (tree / NEW).write_text(NEW_TEXT)
    assert _status(tree, patches) == {"adder": "applied", "edit": "not-applied"}
    # A stray change under the later edit: the earlier patch's file is no longer its own.
    (tree / NEW).write_text(edited.replace("return 7", "return 5"))
    report = patchtool.verify_tree(tree, patchtool.load_series(patches))
    assert [p.status for p in report.patches] == ["partial", "not-applied"]
    first = report.patches[0].files[0]
    assert first.path == NEW and not first.applied
    assert "also after undoing edit: differs from overlay/" in first.detail


def test_the_repository_series_adds_files_only_through_the_overlay() -> None:
    # New vLLM files are kept whole under patches/overlay/ (linted, type-checked, tested);
    # a new-file section inside a diff would hide one from all three again.
    series = patchtool.load_series(Path(__file__).resolve().parents[3] / "patches")
    for p in series.patches:
        assert [s.path for s in p.sections if s.creates] == [], p.file
    added = {p.name: p.header.adds for p in series.patches if p.header.adds}
    ops = "vllm/v1/attention/ops/"
    assert added == {"spec-decode-attn": (ops + "spec_decode_attention.py",
                                          ops + "spec_decode_attention_hopper.py",
                                          ops + "spec_decode_attention_hopper_int8.py",
                                          ops + "spec_decode_attention_plan.py"),
                     "spec-decode-attn-warmup": (
                         "vllm/model_executor/warmup/spec_decode_attn_warmup.py",),
                     "mtp-draft-vocab": ("vllm/model_executor/models/mtp_draft_vocab.py",),
                     "kvarn-cache": (ops + "kvarn.py",),
                     "kvarn-backend": ("vllm/v1/attention/backends/kvarn_attn.py",),
                     "dflash2-lookup": ("vllm/v1/worker/gpu/spec_decode/dflash2/lookup.py",)}
