"""Open JupyterLab on the workbench notebooks (the curated tour on the embedded demo model).

``workbench lab`` starts ``jupyter lab`` on ``notebooks/`` of this checkout, bound to
127.0.0.1, opening ``01_tour.ipynb``.  ``--dry-run`` prints the command instead of
running it; with ``--json`` the launch details are printed as one JSON object first.
Exit status: JupyterLab's own (0 on a clean shutdown), 2 when there is no notebook
directory, the address or port is unusable, or JupyterLab is not installed.

The access token reaches the server through its environment (``JUPYTER_TOKEN``, which
only this user can read in /proc), never its command line; the URL printed for the user
is the only place it appears.  The server starts without the "official Jupyter news?"
prompt: the announcements plugin is disabled through a page config in ``LAB_CONFIG``
(added to ``JUPYTER_CONFIG_PATH``), and no news feed is fetched (``news_url`` None).
The curated notebooks (``notebooks/`` of this checkout, not a directory passed as PATH)
are marked trusted first (:func:`trust_notebooks`), so their saved widget views show
before anything runs: only those named in ``notebooks/trusted.sha256`` (written by
``python -m workbench.notebook build``) with exactly the recorded bytes, no symlink and
no other file in the folder.
"""
from __future__ import annotations

import ipaddress
import json
import os
import secrets
import socket
import sys
from pathlib import Path

from workbench.child import python_argv

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO_ROOT / "notebooks"
FIRST_NOTEBOOK = "01_tour.ipynb"
#: a Jupyter config directory holding ``labconfig/page_config.json`` (the news prompt's plugin disabled)
LAB_CONFIG = Path(__file__).resolve().parent / "_labconfig"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (for tests and ``--port 0``)."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def lab_argv(root: str | os.PathLike, *, port: int = 8888, ip: str = "127.0.0.1",
             token: str | None = None, open_browser: bool = True,
             workspaces_dir: str | os.PathLike | None = None,
             expose_app: bool = False, default_notebook: str | None = FIRST_NOTEBOOK,
             extra: list[str] | None = None) -> list[str]:
    """The ``jupyter lab`` command line used by ``workbench lab`` and the browser test.

    No secret ever goes on it (any local user can read a command line in /proc): pass a
    token through the environment, ``lab_env(token)``.  ``token=""`` disables
    authentication (only sensible on 127.0.0.1 in tests).
    """
    if token:
        raise ValueError("a token on the command line is readable by every local user: pass it with lab_env(token)")
    root = Path(root)
    # isolated (workbench.child): the server imports nothing from the folder it starts in; its
    # kernels get the environment as it is, and their notebook's folder as Jupyter gives it
    argv = python_argv("jupyterlab",
                       f"--ServerApp.root_dir={root}",
                       f"--ServerApp.ip={ip}",
                       f"--ServerApp.port={port}",
                       "--ServerApp.port_retries=0",
                       "--ServerApp.open_browser=" + ("True" if open_browser else "False"),
                       "--LabApp.news_url=None")
    if token == "":
        argv.append("--IdentityProvider.token=")
    if workspaces_dir is not None:
        argv.append(f"--LabApp.workspaces_dir={workspaces_dir}")
    if expose_app:
        argv.append("--expose-app-in-browser")
    if default_notebook and (root / default_notebook).exists():
        argv.append(f"--LabApp.default_url=/lab/tree/{default_notebook}")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")  # CI machines and containers run as root
    argv += list(extra or [])
    return argv


def lab_env(token: str | None = None, base: dict | None = None) -> dict:
    """The server's environment: ``base`` (default: ours) with the token in ``JUPYTER_TOKEN``
    and the workbench lab config (no news prompt) first on ``JUPYTER_CONFIG_PATH``."""
    env = dict(os.environ if base is None else base)
    env.pop("JUPYTER_TOKEN_FILE", None)
    if token:
        env["JUPYTER_TOKEN"] = token
    else:
        env.pop("JUPYTER_TOKEN", None)
    rest = env.get("JUPYTER_CONFIG_PATH")
    env["JUPYTER_CONFIG_PATH"] = str(LAB_CONFIG) + (os.pathsep + rest if rest else "")
    return env


def check_ip(ip: str) -> str:
    """``--ip``: an IPv4 / IPv6 address or ``localhost``; anything else is a UsageError."""
    from workbench.errors import UsageError

    if ip == "localhost":
        return ip
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        raise UsageError(f"--ip {ip!r}: not an IP address (e.g. 127.0.0.1, ::1 or localhost)") from None


#: the committed notebooks' names and SHA-256 of their bytes (``sha256sum`` format), written by
#: ``python -m workbench.notebook build``: the only notebooks ``workbench lab`` signs
MANIFEST_NAME = "trusted.sha256"
MANIFEST = NOTEBOOKS / MANIFEST_NAME
#: a committed notebook is at most this big (the manifest too); a bigger file is not read
MAX_NOTEBOOK_BYTES = 64 << 20


def read_plain(path: Path, limit: int = MAX_NOTEBOOK_BYTES) -> bytes:
    """The bytes of ``path``, a regular file that is no symlink (opened with O_NOFOLLOW,
    checked on the open descriptor, so nothing can swap it in between); OSError otherwise."""
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"not a regular file")
        if st.st_size > limit:
            raise OSError(f"{st.st_size} bytes, over the {limit}-byte limit")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise OSError(f"over the {limit}-byte limit")
        return data
    finally:
        os.close(fd)


def sha256(data: bytes) -> str:
    import hashlib
    return hashlib.sha256(data).hexdigest()


def format_manifest(hashes: dict[str, str]) -> str:
    """``sha256sum`` lines, sorted by name (``sha256sum -c trusted.sha256`` checks them)."""
    return "".join(f"{h}  {n}\n" for n, h in sorted(hashes.items()))


def read_manifest(path=MANIFEST) -> dict[str, str]:
    """name -> SHA-256 of each committed notebook; a missing or malformed manifest trusts
    nothing (an empty dict), a malformed line is skipped."""
    try:
        text = read_plain(Path(path), 1 << 20).decode("ascii")
    except (OSError, UnicodeDecodeError):
        return {}
    out = {}
    for line in text.splitlines():
        h, sep, name = line.partition("  ")
        if sep and len(h) == 64 and all(c in "0123456789abcdef" for c in h) \
                and name.endswith(".ipynb") and name == Path(name).name and not name.startswith("."):
            out[name] = h
    return out


def trusted_notebooks(root, manifest=MANIFEST, *, quiet: bool = False) -> dict[str, bytes]:
    """The notebooks of ``root`` that may be trusted, name -> bytes: each a regular file (no
    symlink) named in the committed manifest, whose bytes hash as the manifest says.  Every
    other ``*.ipynb`` there is named on stderr in one line (unless ``quiet``) and left out."""
    want = read_manifest(manifest)
    out = {}
    for p in sorted(Path(root).glob("*.ipynb")):
        shown = _escape(str(p))
        if p.name not in want:
            why = "not one of the committed notebooks (notebooks/" + MANIFEST_NAME + ")"
        else:
            try:
                data = read_plain(p)
            except OSError as e:
                why = "a symlink or not a regular file" if p.is_symlink() or not p.is_file() else \
                    f"unreadable ({e.strerror or e})"
            else:
                if sha256(data) == want[p.name]:
                    out[p.name] = data
                    continue
                why = "its content differs from the committed notebook's (run python -m workbench.notebook build)"
        if not quiet:
            print(f"workbench lab: {shown}: not trusted, {why}", file=sys.stderr)
    return out


def _escape(s: str) -> str:
    from workbench.errors import printable
    return printable(s)


def trust_notebooks(root, manifest=MANIFEST) -> list[str]:
    """Sign the committed notebooks found in ``root`` in this user's Jupyter trust database,
    as ``jupyter trust`` does, so that JupyterLab renders their saved outputs, widget views
    included, before they are run (an untrusted notebook shows a widget as its text repr).

    Only the notebooks named in the committed manifest (``notebooks/trusted.sha256``) with
    exactly the bytes it records are signed, each read once from a regular file (never
    through a symlink); any other file is named in a line on stderr and left untrusted.
    Returns the names signed now; already trusted ones are left alone, and one that cannot
    be parsed is named in a line on stderr and skipped."""
    from nbformat import NO_CONVERT, reads
    from nbformat.sign import NotebookNotary

    notary = NotebookNotary()
    signed = []
    for name, data in trusted_notebooks(root, manifest).items():
        try:
            nb = reads(data.decode("utf-8"), as_version=NO_CONVERT)
        except Exception as e:  # noqa: BLE001  (nbformat raises many kinds)
            print(f"workbench lab: {_escape(str(Path(root) / name))}: not trusted, unreadable notebook "
                  f"({type(e).__name__})", file=sys.stderr)
            continue
        if not notary.check_signature(nb):
            notary.sign(nb)
            signed.append(name)
    return signed


def add_arguments(p):
    from workbench.errors import number_arg

    p.add_argument("path", nargs="?", default=None,
                   help=f"notebook directory (default: {NOTEBOOKS})")
    p.add_argument("--port", type=number_arg(0, 65535, integer=True), default=8888, help="port to serve on (0: any free port; default 8888)")
    p.add_argument("--ip", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine only)")
    p.add_argument("--no-browser", action="store_true", help="do not open a web browser")
    p.add_argument("--dry-run", action="store_true", help="print the jupyter command and exit")
    p.add_argument("--json", action="store_true", help="print the launch details as JSON")


def run(args) -> int:
    from workbench.errors import UsageError

    root = Path(args.path).absolute() if args.path else NOTEBOOKS
    if not root.is_dir():
        raise UsageError(f"no notebook directory at {root} (workbench lab opens the notebooks/ "
                         f"folder of a source checkout; pass a directory to open another)")
    notebooks = sorted(p.name for p in root.glob("*.ipynb"))
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        raise UsageError("JupyterLab is not installed in this environment (pip install jupyterlab)") from None
    ip = check_ip(args.ip)
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port}: not a TCP port")
    try:
        port = free_port(ip) if args.port == 0 else args.port
    except OSError as e:
        raise UsageError(f"--ip {ip}: cannot listen there ({e.strerror or e})") from None
    token = secrets.token_hex(16)
    argv = lab_argv(root, port=port, ip=ip, open_browser=not args.no_browser and not args.dry_run)
    env = lab_env(token)
    default = FIRST_NOTEBOOK if FIRST_NOTEBOOK in notebooks else ""
    host = f"[{ip}]" if ":" in ip else ip
    url = f"http://{host}:{port}/lab/tree/{default}?token={token}"
    info = {"notebook_dir": str(root), "notebooks": notebooks, "url": url, "command": argv,
            "token_from": "environment (JUPYTER_TOKEN)"}
    # the curated notebooks of this checkout are trusted, so their saved widget views render
    # before they run; a directory the user points at is left to Jupyter's own trust rules
    curated = root.resolve() == NOTEBOOKS.resolve()
    info["trusted"] = sorted(trusted_notebooks(root, quiet=True)) if curated else []
    if args.json:
        print(json.dumps(info), flush=True)
    elif args.dry_run:
        print(" ".join(shlex_quote(a) for a in argv))
    else:
        print(f"workbench lab: {len(notebooks)} notebooks in {root}\n  open {url}\n  (Ctrl-C to stop)", flush=True)
    if args.dry_run:
        return 0
    if curated:
        trust_notebooks(root)
    # become JupyterLab (no wrapper process left behind: Ctrl-C and SIGTERM reach it directly)
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(root)
    os.execve(argv[0], argv, env)
    return 0  # pragma: no cover  (execv does not return)


def shlex_quote(s: str) -> str:
    import shlex
    return shlex.quote(s)


if __name__ == "__main__":  # pragma: no cover
    from workbench.errors import main
    sys.exit(main(["lab", *sys.argv[1:]]))
