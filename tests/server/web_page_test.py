#!/usr/bin/env python3
"""The page at / of `cubevec serve`, driven in headless Chromium over the DevTools protocol.

Starts `cubevec serve` on a free loopback port and Chromium on its page; types a prompt into the
prompt box, clicks Generate, waits for the picture, reads its pixels back from a canvas, and checks
they equal the PNG the job API gives for the same request. With --screenshot FILE it also saves
the page (docs/images/serve_page.png). Standard library only: the WebSocket client is a few lines
here. Exits 77 (CTest's skip) when Chromium is not installed.

Usage: web_page_test.py CUBEVEC_BINARY SOURCE_DIR [--screenshot FILE]
"""
import base64
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

PROMPT = "a large red circle in the center on a blue background"
VIDEO_PROMPT = "a red circle moving right on a blue background"


class DevTools:
    """A DevTools WebSocket session (RFC 6455 client frames: masked, text)."""

    def __init__(self, url):
        match = re.match(r"ws://([^/:]+):(\d+)(/.*)", url)
        self.sock = socket.create_connection((match.group(1), int(match.group(2))), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {match.group(3)} HTTP/1.1\r\nHost: {match.group(1)}:{match.group(2)}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(4096)
        if b" 101 " not in response.split(b"\r\n")[0]:
            raise RuntimeError(f"DevTools refused the WebSocket: {response[:200]!r}")
        self.buffer = response.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0

    def _recv_exact(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError("DevTools closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def _message(self):
        payload = b""
        while True:
            head = self._recv_exact(2)
            length = head[1] & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._recv_exact(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._recv_exact(8))[0]
            payload += self._recv_exact(length)
            if head[0] & 0x80:
                return json.loads(payload)

    def call(self, method, **params):
        self.next_id += 1
        data = json.dumps({"id": self.next_id, "method": method, "params": params}).encode()
        header = bytes([0x81])
        if len(data) < 126:
            header += bytes([0x80 | len(data)])
        elif len(data) < 65536:
            header += bytes([0x80 | 126]) + struct.pack(">H", len(data))
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", len(data))
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        while True:
            message = self._message()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")


def wait_for(what, condition, seconds=60):
    end = time.time() + seconds
    while time.time() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def read_text(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def png_rgb(png):
    """The RGB bytes of an 8-bit RGB, non-interlaced PNG (what cubevec writes), via zlib."""
    import zlib
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", data[:10])
            assert depth == 8 and color == 2, (depth, color)
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    raw, stride, rows, previous = zlib.decompress(idat), width * 3, [], bytearray(width * 3)
    for y in range(len(raw) // (stride + 1)):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - 3] if i >= 3 else 0
            b = previous[i]
            c = previous[i - 3] if i >= 3 else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        previous = line
    return width, b"".join(rows)


def main():
    binary, source = sys.argv[1], sys.argv[2]
    screenshot = sys.argv[sys.argv.index("--screenshot") + 1] if "--screenshot" in sys.argv else None
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not browser:
        print("SKIP: no chromium on PATH (apt-get install chromium)")
        return 77
    scratch = tempfile.mkdtemp(prefix="cubevec_web_")
    serve_err = open(os.path.join(scratch, "serve.err"), "w")
    serve = subprocess.Popen([binary, "serve", "--model", os.path.join(source, "assets/tinyflux"), "--model",
                              os.path.join(source, "assets/tinywan"), "--port", "0"], stderr=serve_err)
    chrome = None
    try:
        port = int(wait_for("cubevec serve to listen",
                            lambda: (re.search(r"listening on http://127\.0\.0\.1:(\d+)", read_text(serve_err.name)) or [None, None])[1]))
        base = f"http://127.0.0.1:{port}"
        chrome_err = open(os.path.join(scratch, "chrome.err"), "w")
        chrome = subprocess.Popen([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-port=0",
                                   f"--user-data-dir={scratch}/profile", "--window-size=900,640", base + "/"],
                                  stdout=subprocess.DEVNULL, stderr=chrome_err, start_new_session=True)
        devtools_port = wait_for("Chromium's DevTools port", lambda: (re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/",
                                                                                  read_text(chrome_err.name)) or [None, None])[1])

        def page_target():
            with urllib.request.urlopen(f"http://127.0.0.1:{devtools_port}/json/list") as r:
                pages = [t for t in json.load(r) if t["type"] == "page" and t["url"].startswith(base)]
            return pages[0]["webSocketDebuggerUrl"] if pages else None

        page = DevTools(wait_for("the page's target", page_target))
        page.call("Emulation.setDeviceMetricsOverride", width=980, height=760, deviceScaleFactor=1, mobile=False)
        wait_for("the model list", lambda: page.evaluate("(() => { const m = document.getElementById('model'); return m ? m.options.length : 0; })()") >= 1)
        # Type the prompt as a user would: focus the box, select its text, insert the new text.
        page.evaluate("(() => { const p = document.getElementById('prompt'); p.focus(); p.select(); return true; })()")
        page.call("Input.insertText", text=PROMPT)
        assert page.evaluate("document.getElementById('prompt').value") == PROMPT
        # Click Generate where it is on the screen.
        box = page.evaluate("(() => { const r = document.getElementById('generate').getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        hit = page.evaluate(f"document.elementFromPoint({box[0]}, {box[1]}).id")
        assert hit == "generate", f"the Generate button is not on top at its own centre ({hit!r} is)"
        page.call("Input.dispatchMouseEvent", type="mouseMoved", x=box[0], y=box[1])
        for kind in ("mousePressed", "mouseReleased"):
            page.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)
        try:
            wait_for("the picture", lambda: page.evaluate(
                "(() => { const i = document.getElementById('picture'); return !!(i && i.complete && i.naturalWidth); })()"), seconds=20)
        except RuntimeError:
            raise RuntimeError("no picture appeared; the page says: " + page.evaluate("document.getElementById('status').textContent") +
                               "; server log:\n" + read_text(serve_err.name))
        status = page.evaluate("document.getElementById('status').textContent")
        assert status.startswith("Done in"), status
        # The picture's pixels, read back through a canvas (RGBA).
        pixels = page.evaluate("""(() => {
            const img = document.getElementById('picture');
            const c = document.createElement('canvas');
            c.width = img.naturalWidth; c.height = img.naturalHeight;
            const g = c.getContext('2d');
            g.drawImage(img, 0, 0);
            return [c.width, c.height, Array.from(g.getImageData(0, 0, c.width, c.height).data)];
        })()""")
        width, height, rgba = pixels
        shown_rgb = bytes(v for i, v in enumerate(rgba) if i % 4 != 3)

        # The same request through the API: the page sent the prompt, seed 0 and the defaults.
        request = json.dumps({"model": "tinyflux", "prompt": PROMPT, "seed": 0}).encode()
        with urllib.request.urlopen(urllib.request.Request(base + "/v1/jobs", data=request, headers={"Content-Type": "application/json"})) as r:
            job = json.load(r)
        wait_for("the API's job", lambda: json.load(urllib.request.urlopen(f"{base}/v1/jobs/{job['id']}"))["status"] == "completed")
        with urllib.request.urlopen(f"{base}/v1/jobs/{job['id']}/content") as r:
            api_width, api_rgb = png_rgb(r.read())
        assert (width, height) == (api_width, len(api_rgb) // (3 * api_width)), (width, height, api_width)
        differing = sum(1 for a, b in zip(shown_rgb, api_rgb) if a != b)
        assert differing == 0, f"{differing} of {len(api_rgb)} colour values differ between the page's picture and the API's"

        if screenshot:
            shot = page.call("Page.captureScreenshot", format="png")
            with open(screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
            print(f"wrote {screenshot}")

        # A video model: its frames play in the page (PNGs from /frames/), with the AVI's link.
        page.evaluate("(() => { const m = document.getElementById('model'); m.value = 'tinywan'; m.dispatchEvent(new Event('change')); return true; })()")
        assert page.evaluate("document.getElementById('frames_label').hidden") is False
        page.evaluate("(() => { const p = document.getElementById('prompt'); p.focus(); p.select(); return true; })()")
        page.call("Input.insertText", text=VIDEO_PROMPT)
        box = page.evaluate("(() => { const r = document.getElementById('generate').getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            page.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)
        try:
            wait_for("the video's frames", lambda: page.evaluate(
                "(() => { const i = document.getElementById('frame'); return !!(i && i.complete && i.naturalWidth && document.getElementById('video_link')); })()"),
                seconds=60)
        except RuntimeError:
            raise RuntimeError("no video frames appeared; the page says: " + page.evaluate("document.getElementById('status').textContent"))
        frame = page.evaluate("(() => { const i = document.getElementById('frame'); return [i.naturalWidth, i.naturalHeight, i.src]; })()")
        assert frame[0] == 64 and frame[1] == 64, frame
        assert re.search(r"/v1/jobs/job_[0-9a-f]+/frames/\d+\.png$", frame[2]), frame
        link = page.evaluate("document.getElementById('video_link').href")
        with urllib.request.urlopen(link) as r:
            assert r.headers["Content-Type"] == "video/x-msvideo" and r.read(4) == b"RIFF", link

        print(f"ok: the page generated {width}x{height}, equal to the API's picture; status: {status}; and a video's frames")
        return 0
    finally:
        if chrome:
            os.killpg(chrome.pid, signal.SIGKILL)
            chrome.wait()
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
