"""What Ray will upload from a working_dir, checked before anything is queued.

Ray packages a working_dir by walking it (following symlinks), skipping what its `excludes`
match (relative to the working_dir) and what each folder's `.gitignore` and `.rayignore` match
(relative to that folder), with gitwildmatch patterns (Ray's copy of pathspec). This walk applies
the same rules with the public pathspec library, but stops as soon as the upload is over the
dashboard's limit, refuses a symlink loop instead of following it forever, refuses what is
neither a file nor a folder (a FIFO, a socket, a device, a link to /dev/zero: Ray's packager
blocks reading those), and reports where the bytes are.

A line that is no pattern git would use (`!` alone, a trailing backslash) is skipped with a
warning naming its file and line, as git skips it. Ray's packager (2.60) fails on some of those
(IndexError): such a working_dir goes to Ray as a zip of what this walk found (`packed`), which
Ray uploads as it is.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import re
import stat
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pathspec import PathSpec

from raystack.errors import ConfigError

# NOTE: Ray's dashboard (aiohttp, client_max_size) refuses request bodies over 100 MiB
# (ray._private.ray_constants.DASHBOARD_CLIENT_MAX_SIZE in 2.60); the package is zipped, the
# bytes counted here are not: the check errs on the safe side.
UPLOAD_LIMIT = 100 * 1024 * 1024
MAX_FILES = 200_000  # a working_dir with more files is a mistake (a dataset, a node_modules)
IGNORE_FILES = (".gitignore", ".rayignore")

# Never uploaded with a working_dir (a spec's `excludes` add to these; `!PATTERN` there takes one
# back). Tooling nobody runs from: VCS data, virtualenvs, caches.
TOOLING = [".git/", ".hg/", ".venv/", "venv/", ".env/", "__pycache__/", "*.pyc"]
TOOLING += [".mypy_cache/", ".pytest_cache/", ".ruff_cache/"]
# Bulk that is usually a run's output (checkpoints, logs, weights); it may also be a job's own
# input or code (an RL repo's env/ package, a small *.bin): what these leave out is told at submit.
BULK = ["env/", "wandb/", "checkpoints/", "checkpoint/", "ckpt/", "outputs/", "output/", "runs/"]
BULK += ["logs/", "*.safetensors", "*.pt", "*.bin"]
# Secrets: a cluster's token, ssh keys, certificates and keys.
SECRETS = ["token", "auth_token", ".ssh/", "*.pem", "*.key"]
DEFAULT_EXCLUDES = [*TOOLING, *BULK, *SECRETS]
MAX_LEFT_OUT = 20  # entries of what BULK left out, kept for the note and a failure's hint

Matcher = Callable[[Path], bool]
log = logging.getLogger("raystack")


def ray_default_excludes() -> list[str]:
    """The excludes Ray adds by itself (2.60: .git, .venv, venv, __pycache__), as Ray reads them."""
    val = os.environ.get("RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES", ".git,.venv,venv,__pycache__")
    return [x.strip() for x in val.split(",") if x.strip()]


def include_gitignore() -> bool:
    """Ray honours .gitignore unless RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1."""
    return os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"


def _compile(lines: list[str]) -> PathSpec:
    # NOTE: the pattern kind Ray 2.60 uses (pathspec deprecates its name, not its meaning); the
    # test against Ray's own packager fails if Ray changes it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return PathSpec.from_lines("gitwildmatch", lines)


def git_patterns(lines: list[str], source: str) -> list[str]:
    """The lines that are patterns (as git reads them); each other one is skipped with a warning
    naming `source` and its line, as git skips it (git says nothing: a line that matches nothing)."""
    kept = []
    for number, line in enumerate(lines, 1):
        try:
            _compile([line])
        except (ValueError, IndexError) as exc:  # (pathspec's GitIgnorePatternError is a ValueError)
            # (the spec's excludes follow raystack's own: their numbers would not be the user's)
            origin = source if source == "excludes" else f"{source} line {number}"
            log.warning(
                "raystack: warning: %s: %r is not a pattern git uses (%s): skipped",
                *(origin, line.rstrip("\n"), type(exc).__name__),
            )
            continue
        kept.append(line)
    return kept


def ray_cannot_read(lines: list[str], source: str) -> list[str]:
    """`source:N` of each line Ray's own packager fails on (its copy of pathspec raises)."""
    try:
        from ray._private.thirdparty.pathspec import PathSpec as RayPathSpec
    except ImportError:  # (another Ray: judged as the public library judges)
        return []
    bad = []
    for number, line in enumerate(lines, 1):
        try:
            RayPathSpec.from_lines("gitwildmatch", [line])
        except Exception:
            bad.append(f"{source}:{number}")
    return bad


def _matcher(base: Path, lines: list[str], source: str = "excludes") -> Matcher:
    spec = _compile(git_patterns(lines, source))
    base = base.absolute()

    def match(path: Path) -> bool:
        return spec.match_file(str(path.absolute().relative_to(base)))

    return match


def _ignore_files(folder: Path, gitignore: bool, trouble: list[str] | None = None) -> list[Matcher]:
    """The matchers of a folder's .gitignore and .rayignore; the lines Ray cannot read go into
    `trouble`."""
    found = []
    for name in IGNORE_FILES if gitignore else IGNORE_FILES[1:]:
        path = folder / name
        if path.is_file():
            with open(path, errors="replace") as fh:
                lines = fh.readlines()
            found.append(_matcher(folder, lines, str(path)))
            if trouble is not None:
                trouble.extend(ray_cannot_read(lines, str(path)))
    return found


@dataclass
class Upload:
    """The files Ray would upload (or the part seen before a limit stopped the walk)."""

    root: Path
    bytes: int = 0
    files: list[str] = field(default_factory=list)  # relative paths
    by_top: dict[str, int] = field(default_factory=dict)  # bytes per top-level entry
    files_by_top: dict[str, int] = field(default_factory=dict)  # files per top-level entry
    too_many_files: bool = False  # the walk stopped at the file limit (not the byte limit)
    left_out: dict[str, str] = field(default_factory=dict)  # path (a folder's with /) -> BULK pattern
    stopped: str | None = None  # why the walk stopped early
    ray_cannot: list[str] = field(default_factory=list)  # file:line (or excludes:N) Ray's packager fails on

    def add(self, rel: Path, size: int) -> None:
        self.bytes += size
        self.files.append(str(rel))
        first = rel.parts[0] + ("/" if len(rel.parts) > 1 else "")
        self.by_top[first] = self.by_top.get(first, 0) + size
        self.files_by_top[first] = self.files_by_top.get(first, 0) + 1

    def biggest(self, n: int = 3) -> list[tuple[str, int]]:
        return sorted(self.by_top.items(), key=lambda kv: -kv[1])[:n]

    def bulk(self) -> list[str]:
        """The top-level entries that make the upload too big (a tenth of it or more; by file
        count when the walk stopped at MAX_FILES): what to exclude, not every entry there is."""
        weights, total = (
            (self.files_by_top, len(self.files)) if self.too_many_files else (self.by_top, self.bytes)
        )
        ranked = sorted(weights.items(), key=lambda kv: -kv[1])
        return [name for name, w in ranked if w * 10 >= total][:3] or [ranked[0][0]]


def scan(root: Path, excludes: list[str], limit: int = UPLOAD_LIMIT, max_files: int = MAX_FILES) -> Upload:
    """Walk `root` as Ray's packager does; stop once over `limit` bytes or `max_files` files.

    Raises ConfigError on a symlink loop (Ray would follow it until the path is too long).
    """
    root = root.absolute()
    gitignore = include_gitignore()
    top = _matcher(root, [*ray_default_excludes(), *excludes])
    bulk = _bulk(root, excludes)
    up = Upload(root, ray_cannot=ray_cannot_read(excludes, "excludes"))
    # (folder, ignore-file matchers in force there, real paths of the folders above it)
    stack: list[tuple[Path, list[Matcher], frozenset[str]]] = [
        (root, _ignore_files(root, gitignore, up.ray_cannot), frozenset({os.path.realpath(root)}))
    ]
    while stack:
        folder, matchers, above = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue  # unreadable: Ray would fail on it too, with its own message
        for entry in entries:
            path = Path(entry.path)
            if any(m(path) for m in matchers):
                continue
            if top(path):
                if (why := bulk(path)) and len(up.left_out) < MAX_LEFT_OUT:
                    up.left_out[_named(path.relative_to(root), why)] = why
                continue
            try:
                st = entry.stat(follow_symlinks=True)
            except OSError:
                continue  # a broken symlink: Ray skips it too
            is_dir, is_file, size = stat.S_ISDIR(st.st_mode), stat.S_ISREG(st.st_mode), st.st_size
            rel = path.relative_to(root)
            if is_dir:
                real = _not_a_loop(root, path, above)
                stack.append(
                    (path, [*matchers, *_ignore_files(path, gitignore, up.ray_cannot)], above | {real})
                )
            elif not is_file:
                raise ConfigError(
                    f"working_dir {root}: {rel} is {_kind(st.st_mode, entry.is_symlink(), path)}; Ray's "
                    f"packager would block reading it: remove it, or add '{rel}' to excludes or to .rayignore"
                )
            else:
                up.add(rel, size)
                if up.bytes > limit:
                    up.stopped = f"over {limit / 2**20:.0f} MiB"
                    return up
                if len(up.files) > max_files:
                    up.stopped, up.too_many_files = f"over {max_files:,} files", True
                    return up
    return up


def _not_a_loop(root: Path, folder: Path, above: frozenset[str]) -> str:
    """A folder's real path, refused where it is one of the folders above it (a symlink loop)."""
    real = os.path.realpath(folder)
    if real in above:
        rel = folder.relative_to(root)
        raise ConfigError(
            f"working_dir {root}: {rel} is a symlink loop (it leads back to {real}); "
            f"Ray would follow it forever: add '{rel}' to excludes or to .rayignore"
        )
    return real


def _bulk(root: Path, excludes: list[str]) -> Callable[[Path], str | None]:
    """The BULK pattern that alone leaves a path out (None: something else does too, or nothing):
    only when `excludes` starts with DEFAULT_EXCLUDES, as a resolved job's do."""
    if excludes[: len(DEFAULT_EXCLUDES)] != DEFAULT_EXCLUDES:
        return lambda path: None
    rest = excludes[len(DEFAULT_EXCLUDES) :]
    others = _matcher(root, [*ray_default_excludes(), *TOOLING, *SECRETS, *rest])
    each = [(pattern, _matcher(root, [pattern, *rest])) for pattern in BULK]

    def which(path: Path) -> str | None:
        if others(path):
            return None
        return next((pattern for pattern, match in each if match(path)), None)

    return which


def _named(rel: Path, why: str) -> str:
    """What a BULK pattern leaves out, as a person would name it: the folder a folder pattern
    (env/) names, not each file in it (a folder's own path does not match such a pattern: its
    files do)."""
    if why.endswith("/"):
        for i, part in enumerate(rel.parts[:-1]):
            if fnmatch.fnmatchcase(part, why.rstrip("/")):
                return "/".join(rel.parts[: i + 1]) + "/"
    return str(rel)


def packed(root: Path, excludes: list[str], folder: Path | None = None) -> Path | None:
    """A zip of what Ray would upload from `root`, where Ray's packager would fail on a line of
    its ignore files or excludes (None where Ray packages it itself): the files this walk finds,
    sorted, with fixed times, so that the same content makes the same zip (and Ray's name for
    it, a hash of it: a prepared upload is found again at submit)."""
    up = scan(root, excludes)
    if not up.ray_cannot or up.stopped:
        return None
    digest = hashlib.sha256()
    for rel in sorted(up.files):
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes())
    folder = folder or Path(tempfile.gettempdir())
    target = folder / f"raystack-wd-{digest.hexdigest()[:20]}.zip"
    if not target.exists():
        part = target.with_suffix(f".{os.getpid()}.part")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as zf:
            for rel in sorted(up.files):
                info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = (os.stat(root / rel).st_mode & 0o7777) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, (root / rel).read_bytes())
        os.replace(part, target)
    log.info(
        "working_dir %s goes to Ray as %s (Ray's packager cannot read %s)", root, target, up.ray_cannot[0]
    )
    return target


def left_out_note(left_out: dict[str, str]) -> str:
    """One line: what the default excludes left out of a job's working_dir, and how to keep it."""
    items = sorted(left_out.items())
    shown = ", ".join(path if path == why else f"{path} ({why})" for path, why in items[:4])
    if len(items) > 4:
        shown += " and more" if len(items) >= MAX_LEFT_OUT else f" and {len(items) - 4} more"
    return (
        f"not uploaded (raystack's default excludes): {shown}; a job that needs one: add "
        f"'!{items[0][1]}' to its excludes (excludes: [\"!{items[0][1]}\"])"
    )


MISSING = re.compile(r"No module named|No such file or directory|FileNotFoundError|can't open file")


def missing_hint(line: str, left_out: dict[str, str]) -> str:
    """For a job that failed on a missing module or file: which of what the default excludes left
    out it names, and the fix ("" when none: the error is the job's own)."""
    if not left_out or not MISSING.search(line):
        return ""
    for path, why in left_out.items():
        name = re.escape(path.rstrip("/"))
        if re.search(rf"(?<![\w.-]){name}(?![\w-])|/{name}(?![\w-])", line):
            return (
                f" ({path} was not uploaded: raystack's default excludes leave out {why}; "
                f"add '!{why}' to its excludes)"
            )
    return ""


def _kind(mode: int, link: bool, path: Path) -> str:
    kind = (
        "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "not a regular file"
    )
    return f"a link to {kind} ({os.path.realpath(path)})" if link else kind


def check(root: Path, excludes: list[str], source: str) -> Upload:
    """Refuse, in one line, a working_dir that Ray's dashboard would refuse (or choke on)."""
    try:
        up = scan(root, excludes)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if up.stopped is None:
        return up
    parts = [f"{name} ({size / 2**20:.0f} MiB)" for name, size in up.biggest()]
    fix = ", ".join(up.bulk())
    raise ConfigError(
        f"{source}: working_dir {root} holds {up.stopped} to upload (Ray's dashboard takes at most "
        f"{UPLOAD_LIMIT / 2**20:.0f} MiB; counted before compression); biggest: {', '.join(parts)}; "
        f"add what it need not carry to excludes (e.g. --set 'excludes=[{fix}]') or to a .rayignore"
    )
