"""The baseline a sweep's tasks start from: the commit at HEAD, and nothing else.

Each task clones that commit, on one machine as on a cluster, so the workspace must hold nothing
HEAD does not: no tracked file changed, and dvc.lock and the metrics files (`cache: false`, which
no cache restores) committed. Then `dvc exp show`'s baseline row has its numbers, `dvc exp diff`
compares against them, and an experiment's parent commit holds the code that made it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prefshift.config.params import Params
from prefshift.core.paths import Layout
from prefshift.pipeline.sweep.commands import SweepError, run_git
from prefshift.pipeline.sweep.record import default_scratch

TARGET = "report"
"""The stage each point runs (`dvc exp run report`): one consistent pipeline state per experiment,
every stage a point's overrides invalidate rerun, and DVC commits every `cache: false` output of the
target's pipeline. `promote` never runs."""


def git_place(root: Path) -> tuple[str, str]:
    """(the top folder of the git repository that holds project `root`, the project's folder in it:
    '' at the top, `ml` for a monorepo's `ml/` made with `dvc init --subdir`). A task clones the
    repository whole and runs DVC in that folder of its clone."""
    top = run_git(root, "rev-parse", "--show-toplevel").removesuffix("\n")
    return top, run_git(root, "rev-parse", "--show-prefix").removesuffix("\n").rstrip("/")


def checked_out_submodules(top: str) -> list[str]:
    """The submodules checked out in the repository at `top`, nested ones after the one that holds
    them, as paths from its top: a clone of HEAD holds none of them until its task checks them out
    (task._submodules); one the workspace leaves out, the clone leaves out too."""
    listed = run_git(
        Path(top), "submodule", "foreach", "--recursive", "--quiet", 'printf "%s\\0" "$displaypath"'
    )
    return [path for path in listed.split("\0") if path]


def _from_project(root: Path, paths: Sequence[str]) -> list[str]:
    """Paths git gives from the top of its repository, as seen from project `root` (`../src/x.py`
    outside it), so that a command run there takes them."""
    prefix = git_place(root)[1]
    return [os.path.relpath(path, prefix or ".") for path in paths]


@contextlib.contextmanager
def open_pipeline(root: Path) -> Iterator[Any]:
    """The project's DVC repository, its pipeline read as DVC reads it, run from the project's folder
    (DVC names stages and vars files from the current one); a folder that is no DVC project, or a
    dvc.yaml DVC cannot read, is a SweepError naming it. The checks and notes of a sweep's start
    each take the one it opens: DVC builds its index once per repository (about half a second on
    prefshift's own pipeline), and each check that opened its own built it again."""
    from dvc.exceptions import DvcException, NotDvcRepoError
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo, contextlib.chdir(root):
            yield repo
    except NotDvcRepoError:
        raise SweepError(
            f"{root}: not a DVC project (no .dvc); a sweep runs its pipeline: `dvc init`"
        ) from None
    except DvcException as err:
        raise SweepError(f"{root}: DVC cannot read the pipeline ({err}); fix dvc.yaml") from None


def project_of(repo: Any) -> Path:
    """The folder of the DVC project `repo` (open_pipeline), whole."""
    return Path(repo.root_dir).resolve()


def pipeline_outputs(repo: Any) -> list[tuple[Path, bool, bool]]:
    """(path relative to the project, DVC-cached?, declared as metrics?) of every stage output."""
    return [
        (Path(out.fs_path).resolve().relative_to(project_of(repo)), out.use_cache, bool(out.metric))
        for stage in repo.index.stages
        for out in stage.outs
    ]


def unversioned_inputs(repo: Any) -> list[str]:
    """Files a stage reads that git does not hold and no stage or `.dvc` file makes (a new module
    left out of `git add`, bytecode Python wrote into a source folder, a file of a submodule, the
    folder a link git holds leads to): dvc.lock hashed them in the workspace, and a point's clone of
    HEAD lacks them, so there each stage reading them would rerun without them, in every point. A
    file DVC ignores (.dvcignore) is no input. A relative link leading out of the repository is
    refused: from a clone, which lies elsewhere, it leads elsewhere."""
    root = project_of(repo)
    top = Path(git_place(root)[0]).resolve()
    outputs = [Path(out.fs_path) for stage in repo.index.stages for out in stage.outs]
    inputs = {Path(dep.fs_path) for stage in repo.index.stages for dep in stage.deps if dep.is_in_repo}
    inputs = {path for path in inputs if path.exists() and not _inside_any(path, outputs)}
    reached, astray = _as_cloned(sorted(inputs | _links_within(top, inputs)), top)
    if astray:
        raise SweepError(_astray(astray[0], root))
    if not reached:
        return []
    found = _unversioned(root, reached, [*outputs, filed_records(root)])
    hashed = [path for path in found if not _dvc_ignores(repo.dvcignore, path, root)]
    return sorted(os.path.relpath(path, root) for path in hashed)


def filed_records(root: Path) -> Path:
    """Where sweeps file their records (reports/sweeps/), which no check of the baseline covers.
    The report reads them for earlier sweeps' ablation tables alone: a point's report may leave
    those out, and the sweep rebuilds the workspace's report with them once its points are in.
    Required committed, they refused the second sweep from a workspace until a commit, and that
    commit made a new baseline, so a sweep repeated as it was could not reuse the experiments of
    the first (they belong to the commit before) and ran every point again."""
    return Layout(root).sweeps_dir


def _rewritten(repo: Any) -> list[Path]:
    """What a sweep writes in the workspace, tracked or not, that no point reads: its records
    (filed_records) and the report it rebuilds, the target's outputs, which every point makes anew.
    Its metrics are left out: `dvc exp show`'s baseline row reads them from HEAD. Required committed,
    a report tracked in git refused the next sweep, as the records did."""
    report = [Path(out.fs_path) for stage in _targets(repo) for out in stage.outs if not out.metric]
    return [filed_records(project_of(repo)), *report]


def _links_within(top: Path, paths: Iterable[Path]) -> set[Path]:
    """The symbolic links git holds inside the folders among `paths`, a submodule's too: DVC
    follows each as it hashes the folder, so each must lead where it does here from a clone too."""
    listed = _ls_files(top, [path for path in paths if path.is_dir()], "--stage")
    return {repo / entry.partition("\t")[2] for repo, entry in listed if entry.startswith("120000 ")}


def _ls_files(top: Path, paths: Sequence[Path], *options: str) -> list[tuple[Path, str]]:
    """(repository, entry) for each entry `git ls-files <options>` gives at or under `paths`
    (absolute, within the repository at `top`), each path asked of the repository that holds it: a
    checked-out submodule's own for one of its files, since git lists none of a submodule's files
    from outside it (and a clone checks out the commit the submodule records)."""
    repositories = [top, *(top / path for path in checked_out_submodules(str(top)))]
    asked: dict[Path, set[str]] = {}
    for path in paths:
        holder = max((repo for repo in repositories if path.is_relative_to(repo)), key=_depth)
        asked.setdefault(holder, set()).add(os.path.relpath(path, holder))
        for inner in (repo for repo in repositories if repo.is_relative_to(path) and repo != path):
            asked.setdefault(inner, set()).add(".")  # a folder holding a submodule: all of it
    return [
        (repo, entry)
        for repo, specs in asked.items()
        for entry in run_git(repo, "ls-files", *options, "-z", "--", *sorted(specs)).split("\0")
        if entry
    ]


def _astray(link: Path, root: Path) -> str:
    """The refusal of `link`, a relative symbolic link leading out of the repository (_as_cloned)."""
    named, where = os.path.relpath(link, root), os.path.normpath(link.parent / os.readlink(link))
    return (
        f"{named}: a relative symbolic link out of the repository, on the way to a file a stage reads or "
        "params name; from a point's clone, which lies elsewhere, it leads elsewhere: make it absolute "
        f"(`ln -sfn {shlex.quote(where)} {shlex.quote(named)}`, then commit it), or track the data with "
        "`dvc add`"
    )


def _as_cloned(paths: Sequence[Path], top: Path) -> tuple[list[Path], list[Path]]:
    """(what a clone of the repository at `top` must hold for it to reach `paths` as the workspace
    does, the links on the way that it reaches elsewhere). git holds a symbolic link as written, so
    from a clone an absolute one leads to the same place, a relative one that stays in the
    repository to the clone's own copy of its target (which the clone must hold too), and a
    relative one leading out of the repository elsewhere. Each path is absolute, within `top`."""
    reached: list[Path] = []
    astray: list[Path] = []
    for path in paths:
        parts, here, hops = list(path.relative_to(top).parts), top, 0
        while parts and hops <= MAX_LINKS:  # past it, a loop of links: DVC fails on it by itself
            here = here / parts.pop(0)
            if not here.is_symlink():
                continue
            reached.append(here)
            if os.path.isabs(text := os.readlink(here)):
                break  # the same place from every clone on this machine
            target, hops = Path(os.path.normpath(here.parent / text)), hops + 1
            if not target.is_relative_to(top):
                astray.append(here)
                break
            parts, here = [*target.relative_to(top).parts, *parts], top
        else:
            reached.append(here)
    return sorted(set(reached)), astray


MAX_LINKS = 40
"""How many links `_as_cloned` follows on one path, as the kernel does (ELOOP)."""


def unversioned_params_inputs(repo: Any, loaded: Sequence[Params]) -> list[str]:
    """Why a point would lack a local input its params name (a dataset file, a model folder: what
    the `inputs` stage hashes) by a path relative to the project: each point reads it in its clone,
    where a path out of the repository lands elsewhere and one git does not hold (a model folder
    left out of git) is missing, so every point failed after the queue. One given whole is read
    where it lies, and one a stage makes is restored in the clone."""
    from prefshift.pipeline.stages.inputs import local_paths

    root = project_of(repo)  # the current folder (open_pipeline): params spell them from there
    spelled = sorted({path for params in loaded for path in local_paths(params)})
    relative = [path for path in spelled if not Path(path).expanduser().is_absolute()]
    found = [path for path in relative if (root / path).exists()]
    if not found:
        return []
    top = Path(git_place(root)[0]).resolve()
    if outside := [path for path in found if not Path(os.path.normpath(root / path)).is_relative_to(top)]:
        return [f"{outside[0]}: a local input given relative to the project but outside its repository, "
                "where a point's clone lies elsewhere; give it whole (an absolute path)"]  # fmt: skip
    reached, astray = _as_cloned([Path(os.path.normpath(root / path)) for path in found], top)
    if astray:
        return [_astray(astray[0], root)]
    outputs = [root / path for path, _, _ in pipeline_outputs(repo)]
    if not (missing := [os.path.relpath(path, root) for path in _unversioned(root, reached, outputs)]):
        return []
    shown = ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else "")
    return [f"{shown}: a local input params name, which git does not hold and no stage makes, so a point's "
            "clone of the baseline lacks it; give its path whole (absolute), or track it (`dvc add`, "
            "then commit)"]  # fmt: skip


def _unversioned(root: Path, paths: Sequence[Path], outputs: Sequence[Path]) -> list[Path]:
    """The files at or under `paths` (absolute) that git does not hold (ignored ones too; a
    submodule's asked of its own git: _ls_files) and that lie in no stage's output (those a clone
    restores from the cache)."""
    found = [repo / name for repo, name in _ls_files(Path(git_place(root)[0]).resolve(), paths, "--others")]
    return sorted(path for path in found if not _inside_any(path, outputs))


def _depth(path: Path) -> int:
    return len(path.parts)


def _inside_any(path: Path, folders: Sequence[Path]) -> bool:
    return any(path.is_relative_to(folder) for folder in folders)


def _dvc_ignores(ignore: Any, path: Path, root: Path) -> bool:
    """Whether DVC leaves `path` out of every hash: it, or a folder holding it, is in .dvcignore."""
    folders = [folder for folder in path.parents if folder != root and folder.is_relative_to(root)]
    return ignore.is_ignored_file(str(path)) or any(ignore.is_ignored_dir(str(f)) for f in folders)


LAUNCHERS = ("accelerate launch", "torchrun")
"""What starts a stage as several processes, one per device (docs/scaling.md)."""


def launches_processes(repo: Any) -> bool:
    """Whether some stage's command starts several processes: else each stage, training included,
    runs as one process on the first device it sees, however many its point is given."""
    commands = [stage.cmd for stage in repo.index.stages if getattr(stage, "cmd", None)]
    texts = [" ".join(cmd) if isinstance(cmd, list) else str(cmd) for cmd in commands]
    return any(launcher in text for text in texts for launcher in LAUNCHERS)


def dvc_cache_dir(root: Path) -> str:
    """The project's DVC cache folder, whole (a path may hold spaces, `#` or `,`), for the clones
    on this machine to share; refused where a clone's config cannot hold it (cache_config)."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        cache = repo.cache.local_cache_dir
    cache_config(cache, root)
    return cache


LOCAL_SECTIONS = ("core", "cache")
"""What a clone on this machine takes from the project's own config.local: how DVC links outputs
from the cache and locks (`cache.type`, `cache.shared`, `core.hardlink_lock`). Its remotes stay
there: a task on one machine pulls and pushes no data."""


def cache_config(cache: str, project: Path) -> str:
    """A clone's config.local: the LOCAL_SECTIONS of `project`'s own config.local (without them, a
    project set to `cache.type hardlink` had each clone copy every output it restored), pointed at
    the DVC cache `cache`. Written by DVC's config library (a path holding `#` or `,` quoted: bare,
    `#` began a comment and `,` made a list), and read back as DVC reads it, interpolation included
    (`%(x)s` in a path is a missing option)."""
    from configobj import ConfigObj, ConfigObjError

    own = Path(project) / ".dvc" / "config.local"
    try:
        settings = ConfigObj(str(own)) if own.is_file() else {}
    except ConfigObjError as err:
        raise SweepError(f"{own}: DVC cannot read it ({err}); fix or remove it") from None
    sections = {name: dict(settings.get(name, {})) for name in LOCAL_SECTIONS}
    sections["cache"]["dir"] = cache
    try:
        lines = ConfigObj({name: section for name, section in sections.items() if section}).write()
        same = ConfigObj(lines)["cache"]["dir"] == cache
    except ConfigObjError:
        same = False
    if not same:
        raise SweepError(
            f"{cache}: DVC's config cannot hold this path (the clones share the project's DVC cache "
            "through it); move the project to a path without `%(` or both kinds of triple quotes"
        )
    return "\n".join(lines) + "\n"


def uncommitted_baseline(repo: Any) -> list[str]:
    """The files that define the pipeline and its baseline that HEAD does not hold as the workspace
    does: a clone lacking one reads another pipeline or none (each dvc.yaml and `.dvc` file, the
    vars files they load), reruns what it recorded (each dvc.lock, and the `cache: false` outputs of
    the stages a point may skip), or lacks what `dvc exp show`'s baseline row and a plain
    `dvc exp diff` read (the metrics files). No cache restores a `cache: false` output."""
    root = project_of(repo)
    stages = list(repo.index.stages)
    dvcfiles = {stage.dvcfile.path: stage.dvcfile for stage in stages}  # each stage's copy parses anew
    files = {Path(path) for path in dvcfiles}
    files |= {path.with_suffix(".lock") for path in files if path.suffix == ".yaml"}
    spelled = _vars_files(stages, dvcfiles.values())  # one named whole is read where it lies
    files |= {Path(os.path.normpath(root / name)) for name in spelled if not os.path.isabs(name)}
    metrics = {Path(out.fs_path) for stage in stages for out in stage.outs if out.metric}
    uncached = [out for stage in upstream_stages(repo) for out in stage.outs if not out.use_cache]
    metrics |= {Path(out.fs_path) for out in uncached}
    top = Path(git_place(root)[0]).resolve()
    if outside := sorted(path for path in files if not path.is_relative_to(top)):
        raise SweepError(
            f"{os.path.relpath(outside[0], root)}: a vars file dvc.yaml names relative to the project but "
            "outside its repository, where a point's clone lies elsewhere: move it into the repository, or "
            "name it whole (an absolute path)"
        )
    ordered = [os.path.relpath(path, root) for path in (*sorted(files), *sorted(metrics)) if path.exists()]
    status = "" if not ordered else run_git(
        root, "status", "--porcelain", "-z", "--no-renames", "--untracked-files=all", "--", *ordered
    )  # fmt: skip
    changed = _from_project(root, [entry[3:] for entry in status.split("\0") if entry])  # -z: names unquoted
    # git names a folder output's files: a folder with one of them changed is named whole
    return [path for path in ordered if any(Path(name).is_relative_to(path) for name in changed)]


def upstream_stages(repo: Any) -> list[Any]:
    """The stages a point's `dvc exp run report` skips where their outputs are current: those the
    target depends on, the target itself left out (it reruns in every point). A `cache: false`
    output of one, which no cache restores, must be in the clone, or the stage reruns in every
    point. None without the target (check_target)."""
    import networkx as nx

    if not (targets := _targets(repo)):
        return []
    graph = repo.index.graph  # each stage points at the stages making its deps
    return [
        stage for target in targets for stage in nx.dfs_postorder_nodes(graph, target) if stage not in targets
    ]


def _targets(repo: Any) -> list[Any]:
    """The target's stages (each `report@<key>` of a foreach one), as DVC names them from the current
    folder, the project's: found in the index DVC has built, not parsed again."""
    return [stage for stage in repo.index.stages if stage.addressing.partition("@")[0] == TARGET]


def check_target(repo: Any) -> None:
    """Refuse a pipeline without the stage each point runs: every point would fail on it."""
    if not _targets(repo):
        raise SweepError(
            f"{project_of(repo)}: no stage {TARGET!r} in dvc.yaml; each point runs `dvc exp run {TARGET}`, "
            "the pipeline's last stage (prefshift's own dvc.yaml has it)"
        )


def _vars_files(stages: Sequence[Any], dvcfiles: Iterable[Any]) -> list[str]:
    """The files the pipeline's dvc.yaml files take `vars` from (params.yaml by default), and those
    whose values a stage uses (its own `vars` too), as DVC names them."""
    resolvers = [resolver for dvcfile in dvcfiles if (resolver := getattr(dvcfile, "resolver", None))]
    used = [name for stage in stages for name in getattr(stage, "tracked_vars", {})]
    return [*(name for resolver in resolvers for name in resolver.context.imports), *used]


def commit_command(paths: Sequence[str]) -> str:
    return f'git add {shlex.join(paths)} && git commit -m "Baseline results for the sweep"'


UNVERSIONED = (
    " (or, for data, track it with `dvc add`; a file no stage needs goes in .dvcignore, since DVC hashes"
    " every file of a folder a stage reads)"
)


def check_head(root: Path) -> None:
    """Refuse a project with no commit for the points to clone."""
    try:
        run_git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    except SweepError:
        raise SweepError(
            f"{root}: no git commit to start from (not a git repository, or one without a commit); each "
            "point runs in a clone of the baseline commit: commit the project, then its baseline"
        ) from None


def check_committed(repo: Any) -> None:
    """Refuse a workspace (with a commit: check_head) that holds anything a task cloning HEAD would
    miss, or no baseline at all: with no dvc.lock every point would compute every stage, the shared
    ones too."""
    root = project_of(repo)
    changed = run_git(root, "diff", "HEAD", "--name-only", "--no-renames", "-z").split("\0")
    changed = _from_project(root, [path for path in changed if path])
    rewritten = _rewritten(repo)
    changed = [path for path in changed if not _inside_any(root / path, rewritten)]
    inputs = unversioned_inputs(repo)
    missing = sorted(set(changed) | set(uncommitted_baseline(repo)) | set(inputs))
    if not (root / "dvc.lock").exists():
        raise SweepError(
            f"{root}: no dvc.lock, so no baseline: every point would compute every stage, the ones they "
            "share too. Run `dvc repro` (`make repro`) first; the sweep then names what to commit"
        )
    if missing:
        *inside, outside = _commits(root, missing)
        raise SweepError(
            f"{root}: not committed: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}; "
            f"each point runs in a clone of the baseline commit, so commit first: {commit_command(outside)}"
            + "".join(f" (in submodule {repo}, first its own: {command})" for repo, command in inside)
            + (UNVERSIONED if inputs else "")
        )


def _commits(root: Path, missing: Sequence[str]) -> list[Any]:
    """How to commit `missing` (paths from project `root`): for each checked-out submodule holding
    some of them or edited, innermost first, (its path, the commit inside it), since `git add` of a
    submodule's file from outside is refused and of the submodule records its commit, not its
    files; then the paths to `git add` in the project, each submodule involved among them."""
    top = Path(git_place(root)[0]).resolve()
    submodules = [top / path for path in checked_out_submodules(str(top))]
    edited = {Path(os.path.normpath(root / path)) for path in _edited_submodules(root)}
    held: dict[Path, set[Path]] = {}
    waiting = [Path(os.path.normpath(root / path)) for path in missing]
    while waiting:
        path = waiting.pop()
        holder = max(
            (sub for sub in submodules if path.is_relative_to(sub) and path != sub), key=_depth, default=top
        )
        waiting += [holder] if holder != top and holder not in held else []
        held.setdefault(holder, set()).add(path)
    inside = []
    for sub in sorted(set(held) - {top} | (edited & set().union(*held.values())), key=_depth, reverse=True):
        files = shlex.join(sorted(os.path.relpath(path, sub) for path in held.get(sub, ())))
        named = os.path.relpath(sub, root)
        commit = f'git -C {shlex.quote(named)} commit{" -a" if sub in edited else ""} -m "For the sweep"'
        inside.append((named, f"git -C {shlex.quote(named)} add {files} && {commit}" if files else commit))
    return [*inside, sorted(os.path.relpath(path, root) for path in held.get(top, ()))]


def _edited_submodules(root: Path) -> list[str]:
    """Submodules whose tracked files are edited, named from the project: a clone checks out the
    commit each records, so the edits are committed inside it first (`git add` of the submodule
    records its commit, not the edits, and the refusal came back as it was)."""
    entries = run_git(root, "status", "--porcelain=v2", "-z", "--untracked-files=no").split("\0")
    fields = [entry.split(" ", 8) for entry in entries if entry.startswith("1 ")]
    return _from_project(root, [field[8] for field in fields if len(field) == 9 and field[2][2:3] == "M"])


def check_scratch(repo: Any, scratch: Path | None) -> None:
    """Refuse a sweep folder (by default the project's) inside a pipeline output: DVC deletes and
    restores an output whole (a stage rerun, `dvc checkout`), and the record and clones with it."""
    root = project_of(repo)
    scratch = scratch or default_scratch(root)
    for output, _, _ in pipeline_outputs(repo):
        if scratch.resolve().is_relative_to(root / output):
            raise SweepError(
                f"--scratch {scratch}: inside {output.as_posix()}, a pipeline output that DVC deletes and "
                "restores whole, and the sweep's record and clones with it; choose a folder outside the "
                "pipeline's outputs (the default is .prefshift/sweeps)"
            )
