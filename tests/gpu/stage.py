"""Stage what the GPU machine lacks (Ray, DeepSpeed, vLLM 0.22 and their small dependencies) for a
machine without network, in parts small enough for one run each.

Here (a machine with the package registry):
    python tests/gpu/stage.py prepare            # -> .stage/part-00 ... part-NN, .stage/MANIFEST.json
There, one run per part (each run carries one part: `carry: [.stage/part-00]`, ...), back to back
while the machine stays warm (about 30 s after a run):
    python tests/gpu/stage.py receive            # keeps the parts this run carried in /tmp/stage
and in the run that carries the last part, before the work:
    python tests/gpu/stage.py install            # checks every part, unpacks into /tmp/site

What is left out of vLLM: FlashAttention 2's kernels (H100/H200 run FA3), the MoE kernels
(dense models only), vllm-rs and DeepGEMM builds for other Pythons; of its dependencies, the
optional GPU-kernel packages (flashinfer, tilelang, cutlass-dsl, quack, tokenspeed, humming) and
what the machine has (torch, torchvision, torchaudio, transformers, numba, ...). The manifest
records every file of every part with its sha256, and what was left out.

`--set core` stages the same without vLLM (2 parts, into /tmp/site): for runs with no engine.
The frameworks (`--set frameworks`: TRL, verl and what they need beyond the above, with verl's
pins transformers 5.9 and the tokenizers it allows) are a set of their own, in .stage/frameworks/,
unpacked into /tmp/site-frameworks (tests/gpu/run.sh puts it before /tmp/site):
    python tests/gpu/stage.py prepare --set frameworks      # here: one part
    python tests/gpu/stage.py install --set frameworks      # there, in the run that carries it
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAGE = REPO / ".stage"
PART_MB = 56  # one part per run: the runs carry at most 64 MiB with the working tree
SITE, INBOX = Path("/tmp/site"), Path("/tmp/stage")
PLATFORM = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
    *(f"--platform={p}" for p in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64",
                                   "manylinux_2_5_x86_64", "manylinux1_x86_64", "linux_x86_64", "any")),
]  # fmt: skip
# What the GPU machine lacks (it has torch 2.11, transformers, tokenizers, numba, pillow, ...).
RAY = [
    "ray==2.60.0", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "aiohttp_cors",
    "colorful", "py-spy", "opencensus", "opencensus-context", "google-api-core", "googleapis-common-protos",
    "proto-plus", "google-auth", "cachetools", "pyasn1", "pyasn1-modules", "rsa", "opentelemetry-sdk",
    "opentelemetry-api", "opentelemetry-exporter-prometheus", "opentelemetry-proto",
    "opentelemetry-semantic-conventions", "smart_open", "virtualenv", "distlib", "platformdirs",
    "importlib-metadata", "zipp", "msgpack", "aiohttp", "aiosignal", "frozenlist", "multidict", "yarl",
    "propcache", "aiohappyeyeballs", "attrs", "grpcio", "protobuf",
]  # fmt: skip
RAYSTACK = [
    "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing_extensions", "httpx",
    "httpcore", "h11", "anyio", "sniffio", "idna", "certifi", "typer", "click", "rich", "markdown-it-py",
    "mdurl", "pygments", "shellingham", "pathspec", "psutil", "pyyaml", "cryptography", "cffi", "pycparser",
]  # fmt: skip
VLLM = [
    "vllm==0.22.1", "lm-format-enforcer==0.11.3", "outlines_core==0.2.14", "diskcache==5.6.3", "lark==1.2.2",
    "compressed-tensors==0.15.0.1", "depyf==0.20.0", "astor", "dill", "blake3", "openai", "jiter", "distro",
    "prometheus-fastapi-instrumentator", "llguidance<1.8", "xgrammar<1.0", "partial-json-parser", "pyzmq",
    "msgspec", "gguf", "watchfiles", "python-json-logger", "pybase64", "cbor2", "ijson", "setproctitle",
    "openai-harmony", "anthropic", "docstring-parser", "mcp", "fastapi", "starlette", "uvicorn",
    "mistral_common", "pycountry", "py-cpuinfo", "einops", "interegular", "cloudpickle", "ninja",
    "model-hosting-container-standards", "jmespath", "pydantic-settings", "python-dotenv", "sse-starlette",
    "httpx-sse", "python-multipart", "opentelemetry-exporter-otlp", "opentelemetry-exporter-otlp-proto-grpc",
    "opentelemetry-exporter-otlp-proto-http", "opentelemetry-exporter-otlp-proto-common",
    "opentelemetry-semantic-conventions-ai", "fastsafetensors", "nvidia-ml-py", "tqdm", "regex",
    # seen missing on the machine: openai's httpx2, xgrammar's tvm-ffi (a newer one than vLLM's
    # pin: the xgrammar pip takes needs it), mistral_common's extra types; DeepSpeed's hjson
    "httpx2", "httpcore2", "truststore", "apache-tvm-ffi", "pydantic-extra-types", "hjson",
]  # fmt: skip
DEEPSPEED = "deepspeed>=0.19,<0.20"
# TRL and verl as released, with what the machine lacks or has in a version they refuse:
# datasets 4.7 (5.x fails on pyarrow 22-26) wants dill<0.4.1 and fsspec<=2026.2; verl 0.9.1 pins
# transformers<5.11 (its vllm extra: 5.9.0), which wants tokenizers<=0.23.0 (0.22.2: no 0.23.0 was
# released; the machine has 0.23.2), and its v1 trainer (the default) imports TransferQueue.
FRAMEWORKS = [
    "trl==1.16.0", "datasets==4.7.0", "dill==0.4.0", "multiprocess==0.70.18", "fsspec==2026.2.0",
    "verl==0.9.1", "transformers==5.9.0", "tokenizers==0.22.2", "hydra-core==1.3.2", "omegaconf==2.3.0",
    "tensordict==0.10.0", "pyvers<0.2", "orjson", "codetiming",
    "pylatexenc", "torchdata", "transferqueue==0.1.11",
]  # fmt: skip
# A job that needs one of these puts its folder first on its PYTHONPATH (env): verl 0.9.1 imports
# trl.AutoModelForCausalLMWithValueHead whenever trl is importable
# (verl/models/transformers/monkey_patch.py:352), which TRL 1.16 no longer has.
APART = {"trl-env": "trl-"}
BUILT = {"frameworks": ["antlr4-python3-runtime==4.9.3"]}  # hydra 1.3's pin: an sdist only (pure Python)
SETS = {
    "base": (STAGE, SITE),
    "core": (STAGE / "core", SITE),  # (the base without vLLM: 2 parts, for runs that need no engine)
    "frameworks": (STAGE / "frameworks", Path("/tmp/site-frameworks")),
}
# Members of the vLLM wheel a small dense model on sm90 does not load.
STRIP = ["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/_moe_C.abi3.so", "vllm/vllm-rs"]
STRIP_GLOBS = ["vllm/third_party/**/*.cpython-3*.so"]  # (but the 3.12 build)


def run(*argv: str) -> None:
    subprocess.run(argv, check=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prepare(which: str) -> int:
    stage, _ = SETS[which]
    wheels, site = stage / "wheels", stage / "site"
    for old in [*stage.glob("part-*"), stage / "MANIFEST.json", wheels, site]:
        shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
    wheels.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "-q"]
    if which == "frameworks":
        run(*pip, "download", "--no-deps", *PLATFORM, "-d", str(wheels), *FRAMEWORKS)
        run(*pip, "wheel", "--no-deps", "-w", str(wheels), *BUILT[which])
    else:
        engine = VLLM if which == "base" else ["hjson"]  # (DeepSpeed's, which the machine lacks)
        run(*pip, "download", "--no-deps", *PLATFORM, "-d", str(wheels), *RAY, *RAYSTACK, *engine)
        build = {**os.environ, "DS_BUILD_OPS": "0"}  # (DeepSpeed builds its ops at run time, if ever)
        subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), DEEPSPEED], check=True, env=build)
    found = sorted(str(w) for w in wheels.glob("*.whl"))
    apart = {
        folder: [w for w in found if Path(w).name.startswith(prefix)] for folder, prefix in APART.items()
    }
    rest = [w for w in found if not any(w in ws for ws in apart.values())]
    run(*pip, "install", "--no-deps", "--no-compile", *PLATFORM, "--target", str(site), *rest)
    for folder, ws in apart.items():
        if ws:
            run(*pip, "install", "--no-deps", "--no-compile", *PLATFORM, "--target", str(site / folder), *ws)
    removed = []
    for rel in STRIP:
        path = site / rel
        if path.exists():
            removed.append(rel)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for pattern in STRIP_GLOBS:
        for path in site.glob(pattern):
            if "cpython-312" not in path.name:
                removed.append(str(path.relative_to(site)))
                path.unlink()
    archive = stage / "site.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=6) as tar:
        tar.add(site, arcname=".")
    parts = split(archive, stage)
    manifest = {
        "set": which,
        "archive_sha256": sha256(archive),
        "parts": {p.name: sha256(p) for p in parts},
        "wheels": sorted(p.name for p in wheels.glob("*.whl")),
        "left_out": removed,
    }
    (stage / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(site)
    shutil.rmtree(wheels)
    archive.unlink()
    size = sum(p.stat().st_size for p in parts) / 2**20
    print(f"{len(parts)} parts, {size:.0f} MiB in all, in {stage} (manifest: {stage / 'MANIFEST.json'})")
    return 0


def split(archive: Path, stage: Path) -> list[Path]:
    parts = []
    with open(archive, "rb") as fh:
        while chunk := fh.read(PART_MB * 2**20):
            part = stage / f"part-{len(parts):02d}"
            part.write_bytes(chunk)
            parts.append(part)
    return parts


def inbox(which: str) -> Path:
    return INBOX if which == "base" else INBOX / which


def receive(which: str) -> int:
    """Keep the parts this run carried (under .stage/ in the run's working tree) in /tmp/stage."""
    stage, box = SETS[which][0], inbox(which)
    box.mkdir(parents=True, exist_ok=True)
    got = sorted(stage.glob("part-*"))
    for part in got:
        shutil.copy(part, box / part.name)
    shutil.copy(stage / "MANIFEST.json", box / "MANIFEST.json")
    print(f"received {[p.name for p in got]}; in {box}: {sorted(p.name for p in box.glob('part-*'))}")
    return 0


def install(which: str) -> int:
    receive(which)
    site, box = SETS[which][1], inbox(which)
    manifest = json.loads((box / "MANIFEST.json").read_text())
    missing = [name for name in manifest["parts"] if not (box / name).exists()]
    if missing:
        print(f"missing parts: {missing} (the machine went cold? send them again)", file=sys.stderr)
        return 1
    bad = [name for name, digest in manifest["parts"].items() if sha256(box / name) != digest]
    if bad:
        print(f"parts that do not match the manifest: {bad}", file=sys.stderr)
        return 1
    archive = box / "site.tar.gz"
    with open(archive, "wb") as out:
        for name in sorted(manifest["parts"]):
            out.write((box / name).read_bytes())
    if sha256(archive) != manifest["archive_sha256"]:
        print("the joined archive does not match the manifest", file=sys.stderr)
        return 1
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(site, filter="data")
    archive.unlink()
    # NOTE: pip --target wrote the console scripts (ray, deepspeed, ...) with the preparing
    # machine's interpreter in their first line: this machine's python3 runs them here.
    for script in (site / "bin").glob("*"):
        if not script.is_file():  # (bin/__pycache__, from a byte-compiling install before this one)
            continue
        text = script.read_bytes()
        if text.startswith(b"#!") and b"python" in text.split(b"\n", 1)[0]:
            script.write_bytes(f"#!{sys.executable}".encode() + text[text.index(b"\n") :])
    # NOTE: the archive carries no bytecode and the GPU machine sets PYTHONDONTWRITEBYTECODE=1:
    # every Ray worker compiled Ray's modules again (Ray's job floor 3.2-4.2 s there, 1.6-2.0 s
    # compiled, 2026-11-28). pip compiles what it installs; so does this, with every core.
    t0 = time.monotonic()
    compileall.compile_dir(site, quiet=2, workers=0)
    print(f"byte-compiled {site} in {time.monotonic() - t0:.1f}s")
    print(f"installed into {site}: use PYTHONPATH={site} PATH={site}/bin:$PATH")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prepare", "receive", "install"])
    parser.add_argument("--set", dest="which", choices=sorted(SETS), default="base")
    args = parser.parse_args()
    return {"prepare": prepare, "receive": receive, "install": install}[args.step](args.which)


if __name__ == "__main__":
    sys.exit(main())
