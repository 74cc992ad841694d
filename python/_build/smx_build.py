"""A minimal PEP 517 build backend for the smx client (standard library only).

It builds a pure-Python wheel of src/smx, so `pip install ./python` needs no
network access and no setuptools.
"""

import base64
import hashlib
import os
import zipfile

NAME = "smx"
VERSION = "0.1.0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
DIST_INFO = f"{NAME}-{VERSION}.dist-info"
METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: Client of smx's local API (smx serve)
Requires-Python: >=3.9
"""
WHEEL = """Wheel-Version: 1.0
Generator: smx_build
Root-Is-Purelib: true
Tag: py3-none-any
"""


def _digest(data):
    h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + h.decode()


def _files():
    for dirpath, dirnames, filenames in os.walk(os.path.join(SRC, NAME)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith((".py", ".typed")):
                full = os.path.join(dirpath, f)
                yield os.path.relpath(full, SRC).replace(os.sep, "/"), full


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def _write_wheel(wheel_directory, entries):
    wheel_name = f"{NAME}-{VERSION}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in entries:
            z.writestr(arcname, data)
            record.append(f"{arcname},{_digest(data)},{len(data)}")
        for arcname, data in ((f"{DIST_INFO}/METADATA", METADATA.encode()), (f"{DIST_INFO}/WHEEL", WHEEL.encode())):
            z.writestr(arcname, data)
            record.append(f"{arcname},{_digest(data)},{len(data)}")
        record.append(f"{DIST_INFO}/RECORD,,")
        z.writestr(f"{DIST_INFO}/RECORD", "\n".join(record) + "\n")
    return wheel_name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for arcname, full in _files():
        with open(full, "rb") as f:
            entries.append((arcname, f.read()))
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(f"_{NAME}_editable.pth", (SRC + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    import tarfile

    base = f"{NAME}-{VERSION}"
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ("pyproject.toml", "_build/smx_build.py"):
            t.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}")
        for arcname, full in _files():
            t.add(full, arcname=f"{base}/src/{arcname}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = METADATA.encode()
        info.size = len(data)
        import io

        t.addfile(info, io.BytesIO(data))
    return name
