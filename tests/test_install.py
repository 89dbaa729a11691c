"""An install that is right everywhere, and a Gradescope runner that finds the submitted file.

The README's first command, the Gradescope bundle's setup.sh and the README's GitHub Classroom workflow install
the torch the kit is tested with (grader.bundle.TESTED_TORCH), the CPU-only build from PyTorch's index
(TORCH_CPU_INDEX); .ci/run pins the same version with no index, as CI's machine provides that wheel.

The commands are parsed as a shell reads them, and pip's own resolver runs them (--dry-run) against two local
indexes that stand in for PyPI (whose Linux torch wheel brings nvidia-* packages) and for PyTorch's CPU index
(torch VERSION+cpu alone): no network, and a command that loses its --index-url resolves to the CUDA build.
"""

import json
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from grader.bundle import TESTED_TORCH, TORCH_CPU_INDEX, run_submission, setup_script, submission_files, write_bundle
from grader.exercise import load_course
from tests.conftest import REFERENCE, ROOT, STUB
from tests.test_notebook import write_notebook

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()
CPU_BUILD = f"{TESTED_TORCH}+cpu"


# -- reading the commands ----------------------------------------------------------------


def fenced(text: str, language: str, after: str = "") -> str:
    """The first ```language block of `text` after the heading `after`."""
    rest = text.split(after, 1)[1] if after else text
    return rest.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def readme_first_command(readme: str = README) -> str:
    return fenced(readme, "bash", "## Install")


def readme_workflow(readme: str = README) -> str:
    return fenced(readme, "yaml", "## In a classroom")


def pip_installs(script: str) -> list[list[str]]:
    """The arguments of every `pip install` in a shell script, in order, each as the shell splits it."""
    found = []
    for line in script.splitlines():
        if "pip" not in line:
            continue
        words = shlex.split(line, comments=True)
        segment: list[str] = []
        for word in [*words, "&&"]:
            if word not in ("&&", "||", ";", "|"):
                segment.append(word)
                continue
            if len(segment) >= 2 and Path(segment[0]).name in ("pip", "pip3") and segment[1] == "install":
                found.append(segment[2:])
            segment = []
    return found


def parse_install(args: list[str]) -> dict:
    """What one `pip install` asks for: its requirements and the indexes it reads."""
    valued = {"-i": "index_url", "--index-url": "index_url", "--extra-index-url": "extra", "-e": "editable",
              "--editable": "editable", "-f": "find_links", "--find-links": "find_links"}
    parsed: dict = {"requirements": [], "index_url": None, "extra": [], "editable": [], "find_links": []}
    words = iter(args)
    for word in words:
        name, _, value = word.partition("=") if word.startswith("--") else (word, "", "")
        if name in valued:
            value = value or next(words)
            key = valued[name]
            if isinstance(parsed[key], list):
                parsed[key].append(value)
            else:
                parsed[key] = value
        elif not word.startswith("-"):
            parsed["requirements"].append(word)
    return parsed


def torch_requirement(parsed: dict) -> Requirement | None:
    for text in parsed["requirements"]:
        try:
            requirement = Requirement(text)
        except ValueError:  # a path, such as /autograder/source/kit
            continue
        if requirement.name == "torch":
            return requirement
    return None


def install_problems(readme: str = README, setup: str | None = None, ci: str = CI) -> list[str]:
    """Every way the install commands disagree with the tested torch, CPU-only on Linux; [] when all agree."""
    sources = {
        "the README's first command": readme_first_command(readme),
        "setup.sh": setup_script() if setup is None else setup,
        "the README's GitHub workflow": readme_workflow(readme),
    }
    problems = []
    for where, script in sources.items():
        installs = [parse_install(args) for args in pip_installs(script)]
        with_torch = [i for i, parsed in enumerate(installs) if torch_requirement(parsed) is not None]
        if len(with_torch) != 1:
            problems.append(f"{where}: {len(with_torch)} pip installs name torch, not 1")
            continue
        torch, rest = installs[with_torch[0]], installs[with_torch[0] + 1:]
        if str(torch_requirement(torch).specifier) != f"=={TESTED_TORCH}":
            problems.append(f"{where}: torch is '{torch_requirement(torch)}', not pinned to {TESTED_TORCH}")
        if torch["index_url"] != TORCH_CPU_INDEX:
            problems.append(f"{where}: torch comes from {torch['index_url'] or 'PyPI'}, not {TORCH_CPU_INDEX}")
        if torch["extra"] or torch["find_links"]:
            problems.append(f"{where}: torch's install reads other indexes too: {torch['extra'] + torch['find_links']}")
        if not rest:
            problems.append(f"{where}: no install of the kit after torch's")
        elif any(parsed["index_url"] for parsed in rest):
            problems.append(f"{where}: the kit's install replaces PyPI with another index")
    ci_torch = [torch_requirement(parse_install(args)) for args in pip_installs(ci)]
    if [str(r) for r in ci_torch if r is not None] != [f"torch=={TESTED_TORCH}"]:
        problems.append(f".ci/run: torch is not pinned to {TESTED_TORCH} once")
    return problems


def without_index(text: str) -> str:
    return text.replace(f" --index-url {TORCH_CPU_INDEX}", "")


def test_every_install_command_takes_the_tested_torch_from_the_cpu_index():
    assert install_problems() == []


def test_the_bundles_setup_sh_is_the_one_checked(tmp_path):
    names = write_bundle(tmp_path / "autograder.zip", load_course()["mha"])
    assert "setup.sh" in names
    setup = zipfile.ZipFile(tmp_path / "autograder.zip").read("setup.sh").decode()
    assert setup == setup_script()
    assert f"pip install -q torch=={TESTED_TORCH} --index-url {TORCH_CPU_INDEX}\n" in setup


@pytest.mark.parametrize("change, says", [
    (lambda r, s: (r.replace(readme_first_command(r), without_index(readme_first_command(r))), s),
     f"the README's first command: torch comes from PyPI, not {TORCH_CPU_INDEX}"),
    (lambda r, s: (r, s.replace(f"torch=={TESTED_TORCH}", "torch")), "setup.sh: torch is 'torch', not pinned"),
    (lambda r, s: (r, s.replace(f"torch=={TESTED_TORCH}", "torch==2.12.0")), "setup.sh: torch is 'torch==2.12.0'"),
    (lambda r, s: (r.replace(readme_workflow(r), readme_workflow(r).replace("--index-url", "--extra-index-url")), s),
     "the README's GitHub workflow: torch comes from PyPI"),
    (lambda r, s: (r.replace(readme_workflow(r), readme_workflow(r).replace(f"torch=={TESTED_TORCH}", "torch")), s),
     "the README's GitHub workflow: torch is 'torch', not pinned"),
])
def test_the_check_fails_when_a_command_goes_wrong(change, says):
    readme, setup = change(README, setup_script())
    assert (readme, setup) != (README, setup_script())
    problems = install_problems(readme, setup)
    assert any(problem.startswith(says) for problem in problems), problems


def test_the_readme_says_what_to_do_with_a_gpu_and_on_a_mac():
    install = README.split("## Install")[1].split("\n## ")[0]
    assert "NVIDIA GPU" in install and "Mac" in install and "drop `--index-url`" in install


def test_the_kits_install_keeps_the_cpu_build():
    """The second command installs the kit; its torch requirement admits the CPU build, so pip keeps it."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = next(Requirement(d) for d in dependencies if Requirement(d).name == "torch")
    assert torch.specifier.contains(CPU_BUILD)


# -- pip's resolver, offline ----------------------------------------------------------------


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A wheel with metadata only, and the simple-index page (folder-simple/NAME/index.html) that lists it."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{dist}.dist-info/METADATA", metadata)
        zf.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                               "Tag: py3-none-any\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    page = folder.parent / f"{folder.name}-simple" / name / "index.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f'<html><body><a href="{path.as_uri()}">{path.name}</a></body></html>\n')


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, str]:
    """file:// stand-ins: PyPI (torch as its Linux wheel, with CUDA's packages) and PyTorch's CPU index."""
    root = tmp_path_factory.mktemp("indexes")
    cuda = ("nvidia-cublas-cu12", "nvidia-cudnn-cu12", "triton")
    _wheel(root / "pypi", "torch", TESTED_TORCH, cuda)
    for name in cuda:
        _wheel(root / "pypi", name, "3.0.0")
    _wheel(root / "cpu", "torch", CPU_BUILD)
    return {"pypi": (root / "pypi-simple").as_uri(), "cpu": (root / "cpu-simple").as_uri()}


def resolve(args: list[str], indexes: dict[str, str], tmp_path: Path) -> list[tuple[str, str]]:
    """What `pip install ARGS` would install, by pip's resolver, with PyTorch's CPU index and PyPI swapped for
    the stand-ins (PyPI as pip's default index: a command that names no index reads it)."""
    args = [indexes["cpu"] if a == TORCH_CPU_INDEX else a for a in args]
    assert not any(a.startswith(("http:", "https:")) for a in args), f"an index with no stand-in here: {args}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # CI's PIP_FIND_LINKS among them
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=indexes["pypi"], PIP_DISABLE_PIP_VERSION_CHECK="1")
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-cache-dir",
               "--retries", "0", "--timeout", "5", "--report", str(report), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return sorted((i["metadata"]["name"], i["metadata"]["version"]) for i in json.loads(report.read_text())["install"])


def torch_args(script: str) -> list[str]:
    return next(args for args in pip_installs(script) if torch_requirement(parse_install(args)))


@pytest.mark.parametrize("where", ["readme", "setup", "workflow"])
def test_pips_resolver_takes_the_cpu_build_and_no_cuda(where, indexes, tmp_path):
    script = {"readme": readme_first_command(), "setup": setup_script(), "workflow": readme_workflow()}[where]
    assert resolve(torch_args(script), indexes, tmp_path) == [("torch", CPU_BUILD)]


def test_without_the_index_pips_resolver_takes_the_cuda_build(indexes, tmp_path):
    """The stand-ins tell the builds apart: the README's command without --index-url is the CUDA download."""
    installed = resolve(torch_args(without_index(readme_first_command())), indexes, tmp_path)
    assert ("torch", TESTED_TORCH) in installed and ("nvidia-cublas-cu12", "3.0.0") in installed


# -- run_autograder: which file it grades --------------------------------------------------


def test_the_runner_takes_the_exercise_by_stem_suffix_and_copy_number(tmp_path):
    names = ["mha.py", "mha (1).py", "mha(3).py", "mha-2.ipynb", "sub/mha (3).ipynb", "mha_numpy.py",
             "mha-checkpoint.ipynb", ".ipynb_checkpoints/mha.ipynb", "__MACOSX/._mha.py", "__MACOSX/mha (9).py",
             "attention.py", "mha.txt", "mha (1).py.txt", "MHA-4.py", "mha.ipynb"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    found = [str(p.relative_to(tmp_path)) for p in submission_files(tmp_path, load_course()["mha"])]
    assert found == ["mha(3).py", "sub/mha (3).ipynb", "mha-2.ipynb", "mha (1).py", "mha.py", "mha.ipynb"]
    assert submission_files(tmp_path / "missing", load_course()["mha"]) == []


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "autograder.zip"
    write_bundle(out, load_course()["mha"])
    return out


def run_autograder(bundle: Path, root: Path, files: dict[str, str], path: str | None = None) -> dict:
    """Lay the bundle out as Gradescope does under `root` with these submitted files; run run_autograder."""
    zipfile.ZipFile(bundle).extractall(root / "source")
    (root / "submission").mkdir()
    for name, text in files.items():
        target = root / "submission" / name
        if name.endswith(".ipynb"):
            write_notebook(target, [("markdown", "# My attempt"), ("code", text)])
        else:
            target.write_text(text)
    run = root / "source" / "run_autograder"
    run.chmod(0o755)
    path = path or f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), PATH=path)
    done = subprocess.run([str(run)], env=env, capture_output=True, text=True, timeout=180)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((root / "results" / "results.json").read_text())


@pytest.mark.parametrize("files, says", [
    ({"mha (1).py": REFERENCE}, "Graded mha (1).py.\n"),
    ({"mha.ipynb": REFERENCE}, "Graded mha.ipynb.\n"),
    ({"mha.py": STUB, "mha-2.py": REFERENCE, "notes.txt": ""},
     "Graded mha-2.py. Not graded: mha.py (of several, the highest copy number is graded"),
])
def test_gradescope_grades_a_renamed_copy_or_a_notebook_and_says_which(bundle, tmp_path, files, says):
    results = run_autograder(bundle, tmp_path / "autograder", files)
    assert results["score"] == 100 and len(results["tests"]) == 9, results
    assert results["output"].startswith(says), results["output"]


def test_gradescope_names_what_it_found_when_no_file_is_the_exercises(bundle, tmp_path):
    results = run_autograder(bundle, tmp_path / "autograder", {"attention.py": REFERENCE, "mha_numpy.py": ""})
    assert results == {"score": 0, "tests": [], "output": "No mha.py or mha.ipynb in the submission (it holds "
                                                          "attention.py, mha_numpy.py): upload your mha.py (or "
                                                          "mha.ipynb) itself."}


def test_a_submitted_link_is_never_graded(tmp_path):
    """Review 49: mha.py linked to the kit's solutions/mha.py was graded as the model answer, 100. A link, or a file
    in a linked folder, is no work of the student's; the results say so."""
    root = tmp_path / "autograder"
    (root / "submission" / "sub").mkdir(parents=True)
    (root / "submission" / "mha.py").symlink_to(ROOT / "solutions" / "mha.py")
    (root / "submission" / "sub" / "mha (1).py").symlink_to(root / "submission" / "mha.py")
    (root / "submission" / "kit").symlink_to(ROOT / "solutions", target_is_directory=True)
    assert submission_files(root / "submission", load_course()["mha"]) == []
    run_submission(root, load_course()["mha"])
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0 and "mha.py, sub/mha (1).py are links, not graded" in results["output"], results


def _stand_in(folder: Path, name: str, code: int) -> str:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(f"#!/bin/sh\nexit {code}\n")
    (folder / name).chmod(0o755)
    return f"{folder}:{Path(sys.executable).parent}:/usr/bin:/bin"


def test_gradescope_reports_a_grader_failure_not_a_silent_zero(bundle, tmp_path):
    path = _stand_in(tmp_path / "bin", "attn-grade", 3)
    results = run_autograder(bundle, tmp_path / "autograder", {"mha.py": REFERENCE}, path)
    assert results["score"] == 0
    assert results["output"] == "The autograder failed (attn-grade exit 3); ask your instructor to rerun it."


def test_gradescope_reports_a_failed_runner_not_a_silent_zero(bundle, tmp_path):
    path = _stand_in(tmp_path / "bin", "python3", 1)
    results = run_autograder(bundle, tmp_path / "autograder", {"mha.py": REFERENCE}, path)
    assert results == {"score": 0, "output": "The autograder failed; ask your instructor to rerun it.", "tests": []}
