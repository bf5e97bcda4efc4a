"""Netron on loopback: an .onnx file as it is, a CVM model converted on the fly to a temporary .onnx.

Netron is the optional extra ``view`` (``pip install netron``). The server listens on 127.0.0.1 only.
"""
from __future__ import annotations

import logging
import os
import signal
import socketserver
import sys
import tempfile
import threading
import time
import webbrowser
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from cvm_onnx.core.errors import FormatError, RuntimeFailure, UnsupportedError

HOST = "127.0.0.1"
CONSENT = ("Netron may first show its own cookie notice (for its error reports and usage statistics; it asks "
           "wherever it cannot tell it runs outside the EU, offline too): Accept, and the graph appears")


def _netron():
    try:
        import netron
    except ImportError:
        raise UnsupportedError("viewing needs Netron, the optional extra view: pip install netron "
                               "(or, in the checkout, pip install -e '.[view]')") from None
    logging.getLogger("netron.server").setLevel(logging.WARNING)  # we say where it serves ourselves
    return netron


def _quiet(address: tuple[str, int]) -> None:
    """Netron's server at ``address`` drops a client that went away (a browser closing a connection while a file
    is sent) without printing socketserver's traceback of BrokenPipeError or ConnectionResetError; it reports
    other errors as before."""
    for thread in threading.enumerate():
        server = getattr(thread, "server", None)
        if isinstance(server, socketserver.BaseServer) and tuple(server.server_address[:2]) == tuple(address):
            def handle_error(request, client, report=server.handle_error):
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    report(request, client)
            server.handle_error = handle_error


@contextmanager
def served(model: str | os.PathLike, port: int = 0, params: str | os.PathLike | None = None) -> Iterator[str]:
    """Serve ``model`` (an .onnx file, or a CVM model directory / symbol file with ``params``) with Netron on
    127.0.0.1 (``port`` 0: a free one) while the block runs; yields the page's URL."""
    from .api import convert, is_onnx, load_onnx

    netron = _netron()
    with tempfile.TemporaryDirectory(prefix="cvm-onnx-view-") as tmp:
        if is_onnx(model):
            path = Path(model)
            if not path.is_file():
                raise FormatError("no such ONNX file", where=os.fspath(model))
            load_onnx(path)  # an ONNX model, not any file named .onnx
        else:
            path = Path(tmp) / f"{Path(model).resolve().name or 'model'}.onnx"
            convert(model, path, params=params)
        try:
            address = netron.serve(os.fspath(path), address=(HOST, port), browse=False)
        except OSError as e:
            raise RuntimeFailure(f"Netron cannot listen on {HOST}:{port}: {e.strerror or e}") from None
        _quiet(address)
        try:
            yield f"http://{address[0]}:{address[1]}"
        finally:
            netron.stop(address)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def view(model: str | os.PathLike, port: int = 0, browse: bool = True, params: str | os.PathLike | None = None,
         ready=print) -> None:
    """Serve ``model`` in Netron until interrupted (Ctrl-C, or SIGTERM in the main thread, so the temporary model
    is removed either way); ``browse`` opens the page in the default browser. ``ready(message)`` is told the URL
    once the server listens."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main else None
    try:
        with served(model, port, params) as url:
            ready(f"Netron serves {model} at {url} (Ctrl-C to stop)")
            ready(CONSENT)
            if browse:
                webbrowser.open(url)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
