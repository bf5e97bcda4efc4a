"""Netron, for real: ``cvm-onnx view models/digits_cnn`` converts the model on the fly and serves it on 127.0.0.1;
headless Chromium loads the page; the graph must render with the CVM op names, shapes on the edges, the
runtime's input names on the function parameters, and a function body that opens. Screenshots go to artifacts/.

Needs Debian's chromium and chromium-driver, and the Python packages selenium and netron (the extra browser;
.ci/run installs it all); each test is skipped with the reason when they are absent.
"""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import cvm_onnx
from cvm_onnx.app.cli import main

ROOT = Path(__file__).parents[2]
MODEL = ROOT / "models" / "digits_cnn"
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
WAIT = 20  # seconds, for every wait below

try:
    import netron
except ImportError:
    netron = None
try:
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    webdriver = None

needs_netron = pytest.mark.skipif(netron is None, reason="netron is not installed (pip install netron)")
needs_browser = pytest.mark.skipif(
    webdriver is None or CHROMIUM is None or DRIVER is None,
    reason="needs selenium (the extra browser: pip install selenium) and Chromium with its driver "
           "(Debian: apt-get install chromium chromium-driver)")

# Offline Netron blocks on a cookie-consent message until a `consent` cookie exists, and loops on "Please update"
# when its build date (meta `date`) is over 180 days old: the cookie is set before loading, the meta removed.
NO_AGE_CHECK = """new MutationObserver((_, observer) => {
    const meta = document.querySelector('meta[name=date]');
    if (meta) { meta.remove(); observer.disconnect(); }
}).observe(document, { childList: true, subtree: true });"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"cvm-onnx view exited with {proc.returncode}: {proc.stderr.read().decode()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"nothing listens on 127.0.0.1:{port} after {WAIT} s")


@pytest.fixture
def view():
    """``cvm-onnx view models/digits_cnn --no-browser`` on a free port: (url, process); stopped with SIGTERM."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cvm_onnx.app.cli", "view", str(MODEL), "--port", str(port),
                             "--no-browser"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_listening(port, proc)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,1800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


def texts(driver) -> list[str]:
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#canvas text")]


def rendered(driver, expected: set[str]) -> list[str]:
    """Wait until the graph shows every label in ``expected``; the page's message (if any) explains a timeout."""
    try:
        WebDriverWait(driver, WAIT).until(lambda d: expected <= set(texts(d)))
    except TimeoutException:
        message = driver.execute_script("const m = document.getElementById('message-text'); "
                                        "return m ? m.innerText : ''")
        pytest.fail(f"Netron did not render {sorted(expected - set(texts(driver)))}; page message: {message!r}")
    return texts(driver)


@needs_netron
@needs_browser
def test_netron_renders_the_converted_model(view, browser):
    url, proc = view
    browser.execute_cdp_cmd("Network.setCookie", {"name": "consent", "value": "1", "url": url})
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": NO_AGE_CHECK})
    browser.get(url)
    graph = cvm_onnx.load(MODEL).graph
    labels = rendered(browser, set(graph.op_counts()))  # every CVM op of the model, one node each
    assert browser.execute_script("return document.querySelector('meta[name=date]')") is None  # age check off
    shapes = {"×".join(map(str, n.outputs[0].shape)) for n in graph.nodes if n.op == "conv2d"}
    assert shapes | {"×".join(map(str, graph.type_of(graph.heads[0]).shape))} <= set(labels)  # shapes on the edges
    assert any(t.startswith("weight") for t in labels) and any(t.startswith("bias") for t in labels)
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "netron-digits_cnn.png"))

    conv = next(n for n in browser.find_elements(By.CSS_SELECTOR, "#canvas g.node") if n.text.startswith("conv2d"))
    next(t for t in conv.find_elements(By.CSS_SELECTOR, "text") if t.text == "ƒ").click()  # open the function
    body = rendered(browser, {"Conv", "Cast"})
    assert "conv2d" not in body
    browser.save_screenshot(str(ARTIFACTS / "netron-digits_cnn-conv2d.png"))

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT) == 0
    assert f"at {url} (Ctrl-C to stop)" in proc.stdout.read().decode()


@needs_netron
def test_served_model_is_the_export_and_the_server_stops(tmp_path):
    from cvm_onnx.app.view import served

    onnx_file = tmp_path / "m.onnx"
    cvm_onnx.convert(MODEL, onnx_file)
    for model, name in ((MODEL, "digits_cnn.onnx"), (onnx_file, "m.onnx")):
        with served(model, free_port()) as url, urllib.request.urlopen(f"{url}/data/{name}", timeout=WAIT) as r:
            assert r.read() == onnx_file.read_bytes()
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=2)


@needs_netron
def test_a_browser_dropping_connections_prints_no_traceback(capfd):
    """A client that resets its connection while a large file is sent (a browser closing a tab) is not reported
    with socketserver's traceback; the server keeps serving."""
    import struct

    from cvm_onnx.app.view import served

    with served(MODEL, free_port()) as url:
        host, port = url.rpartition("/")[2].split(":")
        for _ in range(3):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the 5 MB file cannot all be sent at once
                s.connect((host, int(port)))
                s.sendall(b"GET /onnx-metadata.json HTTP/1.1\r\nHost: x\r\n\r\n")
                s.recv(100)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        time.sleep(0.5)  # the handlers meet the reset
        with urllib.request.urlopen(url, timeout=WAIT) as r:
            assert r.status == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err


def test_readme_installs_netron_alone_and_says_what_netron_shows_first(monkeypatch):
    """The README's view step installs the extra `view` as what it holds, netron (reinstalling the package would
    rebuild the native library), and says, as `view` itself does, that Netron may open on its cookie notice."""
    import re
    import types

    from cvm_onnx.app import view

    [extra] = re.findall(r"^view = \[(.*)\]", (ROOT / "pyproject.toml").read_text(), re.M)  # tomllib: Python 3.11
    assert re.findall(r'"([\w-]+)', extra) == ["netron"]
    readme = (ROOT / "README.md").read_text()
    [line] = [x for x in readme.splitlines() if "cvm-onnx view models/" in x]
    assert line.startswith("pip install netron && cvm-onnx view ") and "-e" not in line.split("&&")[0]
    assert "cookie notice" in readme and "Accept" in readme
    said = []
    if netron is not None:
        def interrupt(seconds):
            raise KeyboardInterrupt

        monkeypatch.setattr(view, "time", types.SimpleNamespace(sleep=interrupt))  # Ctrl-C while serving
        view.view(MODEL, port=free_port(), browse=False, ready=said.append)
        assert said[1] == view.CONSENT and "cookie notice" in said[1] and "Accept" in said[1]


def test_view_without_netron_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "netron", None)  # import netron raises ImportError
    assert main(["view", str(MODEL), "--no-browser"]) == 4
    assert "pip install netron (or, in the checkout, pip install -e '.[view]')" in capsys.readouterr().err
