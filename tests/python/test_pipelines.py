"""The Python module's pipelines (issue 38, Deliver 1 and 3): the pixels of `cubevec t2i` / `t2v`
for the same request, diffusers' argument names, threads sharing one pipeline, the step callback,
Ctrl-C, and a named exception for every bad argument. Run by CTest (python.pytest) with
PYTHONPATH=build/python and CUBEVEC_BINARY / CUBEVEC_SOURCE_DIR set."""

import os
import signal
import struct
import subprocess
import threading
import zlib

import numpy as np
import pytest

import cubevec
from safetensors_files import write_safetensors

SOURCE = os.environ.get("CUBEVEC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("CUBEVEC_BINARY", os.path.join(SOURCE, "build", "cubevec"))
TINYFLUX = os.path.join(SOURCE, "assets", "tinyflux")
TINYWAN = os.path.join(SOURCE, "assets", "tinywan")
PROMPT = "a large red circle in the center on a blue background"
WAN_PROMPT = "a red circle moving left on a blue background"  # tinywan's vocabulary


def read_png(path):
    """8-bit RGB, non-interlaced PNG (what cubevec writes), decoded with zlib: the test's own reader."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert (depth, color, interlace) == (8, 2, 0)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * 3
    out = np.zeros((height, stride), np.int32)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        up = out[y - 1] if y else np.zeros(stride, np.int32)
        row = np.zeros(stride, np.int32)
        for x in range(stride):
            left = row[x - 3] if x >= 3 else 0
            corner = up[x - 3] if x >= 3 else 0
            if kind == 0:
                predictor = 0
            elif kind == 1:
                predictor = left
            elif kind == 2:
                predictor = up[x]
            elif kind == 3:
                predictor = (left + up[x]) // 2
            else:
                p = left + up[x] - corner
                pa, pb, pc = abs(p - left), abs(p - up[x]), abs(p - corner)
                predictor = left if pa <= pb and pa <= pc else up[x] if pb <= pc else corner
            row[x] = (line[x] + predictor) & 255
        out[y] = row
    return out.reshape(height, width, 3).astype(np.uint8)


@pytest.fixture(scope="module")
def flux():
    return cubevec.FluxPipeline.from_pretrained(TINYFLUX)


def test_flux_pixels_equal_the_command_lines(flux, tmp_path):
    png = tmp_path / "cli.png"
    subprocess.run([BINARY, "t2i", "--model", TINYFLUX, "--prompt", PROMPT, "--steps", "3", "--seed", "9", "--width", "48",
                    "--height", "32", "--out", str(png)], check=True, capture_output=True)
    out = flux(prompt=PROMPT, num_inference_steps=3, generator=9, width=48, height=32, output_type="np")
    assert out.frames is None and len(out.images) == 1
    image = out.images[0]
    assert image.shape == (32, 48, 3) and image.dtype == np.uint8
    assert np.array_equal(image, read_png(png))
    assert out.report["steps"] == 3 and out.report["seed"] == 9
    assert "denoising" in out.report["stages_s"]


def test_int8_attention_equals_the_command_line(flux, tmp_path):
    png = tmp_path / "cli.png"
    args = [BINARY, "t2i", "--model", TINYFLUX, "--prompt", PROMPT, "--steps", "3", "--seed", "9", "--width", "48", "--height", "32",
            "--out", str(png), "--quant-attention", "int8"]
    cli = subprocess.run(args, capture_output=True, text=True)
    try:
        out = flux(prompt=PROMPT, num_inference_steps=3, generator=9, width=48, height=32, output_type="np", quant_attention="int8")
    except ValueError as e:  # a CPU without AMX-INT8: both refuse the request, naming what is missing
        assert "needs AMX-INT8" in str(e) and cli.returncode != 0 and "needs AMX-INT8" in cli.stderr
        return
    assert cli.returncode == 0, cli.stderr
    assert np.array_equal(out.images[0], read_png(png))
    stage = next(s for s in out.report["stages"] if s["name"] == "quant-attention int8")
    assert stage["settings"]["int8_calls"] > 0
    exact = flux(prompt=PROMPT, num_inference_steps=3, generator=9, width=48, height=32, output_type="np")
    assert not np.array_equal(out.images[0], exact.images[0])


def test_wan_frames_equal_the_command_lines(tmp_path):
    wan = cubevec.WanPipeline.from_pretrained(TINYWAN)
    subprocess.run([BINARY, "t2v", "--model", TINYWAN, "--prompt", WAN_PROMPT, "--steps", "2", "--seed", "4", "--width", "32",
                    "--height", "32", "--frames", "17", "--out", str(tmp_path / "v.avi"), "--frames-dir", str(tmp_path)],
                   check=True, capture_output=True)
    out = wan(prompt=WAN_PROMPT, num_inference_steps=2, generator=4, width=32, height=32, num_frames=17)
    assert out.images is None and len(out.frames) == 1 and len(out.frames[0]) == 17
    for i, frame in enumerate(out.frames[0]):
        assert np.array_equal(frame, read_png(tmp_path / f"frame_{i:05d}.png")), i


def test_threads_calling_one_pipeline_get_the_sequential_pixels(flux):
    want = [flux(prompt=PROMPT, num_inference_steps=2, generator=s, width=32, height=32, output_type="np").images[0]
            for s in (1, 2, 3)]
    got = [None] * 3

    def run(i):
        got[i] = flux(prompt=PROMPT, num_inference_steps=2, generator=i + 1, width=32, height=32, output_type="np").images[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        assert np.array_equal(got[i], want[i]), i


def test_the_step_callback_runs_each_step_and_its_exception_stops_the_call(flux):
    steps = []
    flux(prompt=PROMPT, num_inference_steps=3, width=32, height=32, output_type="np",
         callback_on_step_end=lambda pipe, step, timestep, kwargs: steps.append(step))
    assert steps == [0, 1, 2]

    def stop(pipe, step, timestep, kwargs):
        if step == 1:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        flux(prompt=PROMPT, num_inference_steps=5, width=32, height=32, output_type="np", callback_on_step_end=stop)
    # The pipeline stays usable.
    assert flux(prompt=PROMPT, num_inference_steps=1, width=32, height=32, output_type="np").images[0].shape == (32, 32, 3)


def test_ctrl_c_interrupts_a_long_call(flux):
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        flux(prompt=PROMPT, num_inference_steps=200, width=64, height=64, output_type="np")
    timer.join()


@pytest.mark.parametrize("kwargs, error, words", [
    ({"num_inference_steps": 0}, ValueError, "num_inference_steps"),
    ({"num_inference_steps": 2.5}, TypeError, "num_inference_steps must be an int"),
    ({"num_inference_steps": True}, TypeError, "num_inference_steps must be an int"),
    ({"height": 17}, ValueError, "height"),
    ({"width": 33}, ValueError, "width"),
    ({"width": -64}, ValueError, "width"),
    ({"guidance_scale": float("nan")}, ValueError, "guidance_scale"),
    ({"guidance_scale": "3.5"}, TypeError, "guidance_scale must be a float"),
    ({"true_cfg_scale": float("inf")}, ValueError, "true_cfg_scale must be finite"),
    ({"prompt": 7}, TypeError, "prompt must be a str"),
    ({"prompt": ["a", "b"]}, TypeError, "prompt must be a str"),
    ({"prompt": "bad \ud800 text"}, ValueError, "prompt is not valid Unicode"),
    ({"negative_prompt": b"bytes"}, TypeError, "negative_prompt must be a str"),
    ({"generator": -1}, ValueError, "generator must be a seed in"),
    ({"generator": 2 ** 64}, ValueError, r"generator must be a seed in \[0, 2\*\*64\)"),
    ({"cache": {"cache": "db", "cache-threshold": float("nan")}}, ValueError, r"cache\['cache-threshold'\] must be finite"),
    ({"cache": object()}, TypeError, "cache must be a method name"),
    ({"sparse": {"type": "ada_bsa", "sparsity": 2.0}}, ValueError, "sparsity"),
    ({"cfg": "both"}, ValueError, "cfg"),
    ({"callback_on_step_end": 5}, TypeError, "callback_on_step_end must be callable"),
    ({"guidance_scale": 10 ** 400}, ValueError, "guidance_scale must be finite"),
    ({"cache": 1}, TypeError, "cache must be a method name"),
    ({"sparse": False}, TypeError, "sparse must be a method name"),
    ({"cache": {"cache": {"nested": 1}}}, TypeError, r"cache\['cache'\] must be a str, a number or a bool"),
    ({"cache": {"\ud800": 1}}, ValueError, "cache setting name is not valid Unicode"),
    ({"prompt": None}, ValueError, "prompt is required"),
    ({"prompt": "   "}, ValueError, "prompt must not be blank"),
    ({"cfg": "off\x00"}, ValueError, "cfg holds a NUL"),
    ({"cache": "fast"}, ValueError, "cache"),
    ({"generator": object()}, TypeError, "generator must be an int seed"),
    ({"output_type": "latent"}, ValueError, "output_type"),
    ({"num_frames": 5}, TypeError, "num_frames"),
    ({"quant_attention": "fp8"}, ValueError, "quant_attention"),
    ({"quant_attention": 8}, TypeError, "quant_attention must be a str"),
])
def test_bad_call_arguments_raise_named_errors(flux, kwargs, error, words):
    call = {"prompt": PROMPT, "num_inference_steps": 1, "width": 32, "height": 32, "output_type": "np"}
    call.update(kwargs)
    with pytest.raises(error, match=words):
        flux(**call)


def test_bad_loads_raise_named_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        cubevec.FluxPipeline.from_pretrained(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="dtype"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, dtype="f16")
    with pytest.raises(ValueError, match="offload"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, offload=-1)
    with pytest.raises(TypeError, match="path must be a path"):
        cubevec.FluxPipeline.from_pretrained(42)
    with pytest.raises(ValueError, match="path holds a NUL character"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX + "\0x")
    with pytest.raises(ValueError, match="path must be UTF-8"):  # reports carry the path as text
        cubevec.FluxPipeline.from_pretrained(os.fsencode(str(tmp_path)) + b"/\xff")
    with pytest.raises(NotADirectoryError, match="not a folder"):
        cubevec.FluxPipeline.from_pretrained(os.path.join(TINYFLUX, "transformer", "config.json"))
    with pytest.raises(FileNotFoundError, match=r"no such file \(quant\)"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, quant=str(tmp_path / "missing.json"))
    with pytest.raises(IsADirectoryError, match=r"quant"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, quant=str(tmp_path))
    with pytest.raises(ValueError, match="timestep_policy applies with quant"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, timestep_policy=str(tmp_path / "p.json"))
    with pytest.raises(ValueError, match="packed_cache does not combine with offload"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, packed_cache=str(tmp_path), offload=1)
    with pytest.raises(TypeError, match="memory_limit must be an int"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, memory_limit=1.5)
    with pytest.raises(ValueError, match="variant holds a NUL"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, variant="fp\x0016")
    with pytest.raises(cubevec.Error, match="offload 9") as info:  # the library's message, in from_pretrained's terms
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, offload=9)
    assert "--" not in str(info.value)
    with pytest.raises(TypeError, match="packed_cache must be a path"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, packed_cache=False)
    with pytest.raises(TypeError, match="check_weights must be a bool"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, check_weights="yes")
    with pytest.raises(TypeError, match="dtype must be a str"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, dtype=None)
    with pytest.raises(ValueError, match="memory_limit"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, memory_limit="lots")
    with pytest.raises(ValueError, match="a flux model, not wan"):
        cubevec.WanPipeline.from_pretrained(TINYFLUX)
    (tmp_path / "empty").mkdir()
    with pytest.raises(cubevec.Error):
        cubevec.FluxPipeline.from_pretrained(str(tmp_path / "empty"))


def test_diffusers_conventions(flux):
    # output_type is checked before any work: no step runs.
    steps = []
    with pytest.raises(ValueError, match="output_type"):
        flux(prompt=PROMPT, num_inference_steps=2, width=32, height=32, output_type="latent",
             callback_on_step_end=lambda *a: steps.append(1))
    assert steps == []
    # generator=None draws a fresh seed (the report says which), as diffusers without a generator.
    a = flux(prompt=PROMPT, num_inference_steps=1, width=32, height=32, output_type="np")
    b = flux(prompt=PROMPT, num_inference_steps=1, width=32, height=32, output_type="np")
    assert a.report["seed"] != b.report["seed"] and not np.array_equal(a.images[0], b.images[0])
    again = flux(prompt=PROMPT, num_inference_steps=1, width=32, height=32, output_type="np", generator=a.report["seed"])
    assert np.array_equal(again.images[0], a.images[0])
    # NumPy integers are ints.
    c = flux(prompt=PROMPT, num_inference_steps=np.int64(1), width=np.int32(32), height=32, output_type="np",
             generator=np.uint16(5), guidance_scale=np.float32(3.5))
    assert c.report["seed"] == 5 and c.images[0].shape == (32, 32, 3)
    # true CFG runs when true_cfg_scale > 1 and a negative prompt is given (diffusers' rule).
    plain = flux(prompt=PROMPT, num_inference_steps=1, width=32, height=32, output_type="np", generator=3, negative_prompt="green")
    assert plain.report["cfg"] == "off"
    cfg = flux(prompt=PROMPT, num_inference_steps=1, width=32, height=32, output_type="np", generator=3, negative_prompt="green",
               true_cfg_scale=4.0)
    assert cfg.report["cfg"] == "fused" and not np.array_equal(cfg.images[0], plain.images[0])
    with pytest.warns(UserWarning, match="true_cfg_scale > 1 without a negative_prompt"):
        flux(prompt=PROMPT, num_inference_steps=1, width=32, height=32, output_type="np", true_cfg_scale=4.0)


def test_image_to_image_and_inpainting_equal_the_command_lines(flux, tmp_path):
    source = tmp_path / "source.png"
    subprocess.run([BINARY, "t2i", "--model", TINYFLUX, "--prompt", PROMPT, "--seed", "2", "--width", "48", "--height", "32",
                    "--out", str(source)], check=True, capture_output=True)
    picture = read_png(source)
    mask = np.zeros((32, 48), np.uint8)
    mask[:, 24:] = 255
    mask_png = tmp_path / "mask.png"
    mask_png.write_bytes(cubevec.pipelines._png_bytes(np.repeat(mask[:, :, None], 3, axis=2)))
    for extra, kwargs in ((["--strength", "0.6"], {"strength": 0.6}),
                          (["--mask", str(mask_png), "--strength", "1"], {"mask_image": mask, "strength": 1.0})):
        cli = tmp_path / "cli.png"
        subprocess.run([BINARY, "t2i", "--model", TINYFLUX, "--prompt", "a small green triangle at the right on a white background",
                        "--seed", "4", "--steps", "6", "--width", "48", "--height", "32", "--image", str(source), "--out", str(cli)] + extra,
                       check=True, capture_output=True)
        # The picture as an array (written losslessly for the library) and as its file give the CLI's pixels.
        for image in (picture, str(source)):
            out = flux(prompt="a small green triangle at the right on a white background", generator=4, num_inference_steps=6,
                       width=48, height=32, output_type="np", image=image, **kwargs)
            assert np.array_equal(out.images[0], read_png(cli)), extra
        assert out.report["mode"] == ("inpaint" if "mask_image" in kwargs else "img2img")
    with pytest.raises(TypeError, match="image must be a path, a PIL image or a uint8 array"):
        flux(prompt=PROMPT, image=5, output_type="np")
    with pytest.raises(ValueError, match="image must be an H x W x 3"):
        flux(prompt=PROMPT, image=picture.astype(np.float32), output_type="np")
    with pytest.raises(FileNotFoundError, match=r"no such file \(image\)"):
        flux(prompt=PROMPT, image=str(tmp_path / "missing.png"), output_type="np")
    with pytest.raises(ValueError, match=r"'strength' must be in \(0, 1\]"):
        flux(prompt=PROMPT, image=picture, strength=0.0, output_type="np")
    with pytest.raises(ValueError, match="mask needs image|needs --image|mask_image needs image"):
        flux(prompt=PROMPT, mask_image=mask, output_type="np")


def write_tiny_lora(path):
    """A rank-2 LoRA on tinyflux's transformer_blocks.0.attn.to_q (its shape read from the checkpoint)."""
    import json as json_module
    weights = os.path.join(TINYFLUX, "transformer", "diffusion_pytorch_model.safetensors")
    with open(weights, "rb") as f:
        header = json_module.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    out_features, in_features = header["transformer_blocks.0.attn.to_q.weight"]["shape"]
    write_safetensors(path, {
        "transformer.transformer_blocks.0.attn.to_q.lora_A.weight": np.sin(np.arange(2 * in_features) * 0.3).reshape(2, in_features),
        "transformer.transformer_blocks.0.attn.to_q.lora_B.weight": np.cos(np.arange(out_features * 2) * 0.7).reshape(out_features, 2)})


def test_lora_fused_at_load_equals_the_command_line(tmp_path):
    lora = tmp_path / "tiny_lora.safetensors"
    write_tiny_lora(lora)
    cli = tmp_path / "cli.png"
    subprocess.run([BINARY, "t2i", "--model", TINYFLUX, "--prompt", PROMPT, "--seed", "2", "--steps", "3", "--width", "32", "--height", "32",
                    "--lora", f"{lora}:0.5", "--out", str(cli)], check=True, capture_output=True)
    pipe = cubevec.FluxPipeline.from_pretrained(TINYFLUX, lora=[(str(lora), 0.5)])
    out = pipe(prompt=PROMPT, generator=2, num_inference_steps=3, width=32, height=32, output_type="np")
    assert np.array_equal(out.images[0], read_png(cli))
    with pytest.raises(FileNotFoundError, match=r"no such file \(lora\)"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, lora=str(tmp_path / "missing.safetensors"))
    with pytest.raises(ValueError, match="lora scale must be finite"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, lora=(str(lora), float("nan")))
    with pytest.raises(ValueError, match="lora must name at least one file"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, lora=[])
    with pytest.raises(TypeError, match="lora_ignore_unmatched must be a bool"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, lora=str(lora), lora_ignore_unmatched="yes")
    assert cubevec.FluxPipeline.from_pretrained(TINYFLUX, lora=str(lora), lora_ignore_unmatched=True)


def test_lora_per_call_at_run_time(tmp_path):
    lora = tmp_path / "tiny_lora.safetensors"
    write_tiny_lora(lora)
    call = dict(prompt=PROMPT, generator=2, num_inference_steps=3, width=32, height=32, output_type="np")
    pipe = cubevec.FluxPipeline.from_pretrained(TINYFLUX)
    plain = pipe(**call).images[0]
    with_lora = pipe(**call, lora=(str(lora), 0.5))
    assert with_lora.report["lora"]["request"] == [f"{lora}:0.5"]
    fused = cubevec.FluxPipeline.from_pretrained(TINYFLUX, lora=[(str(lora), 0.5)])(**call).images[0]
    runtime = cubevec.FluxPipeline.from_pretrained(TINYFLUX, lora=[(str(lora), 0.5)], lora_mode="runtime")(**call).images[0]
    assert np.array_equal(runtime, with_lora.images[0])  # the load's runtime LoRA and a call's are the same computation
    assert np.abs(runtime.astype(int) - fused.astype(int)).max() <= 2  # fused: the same LoRA, rounded in another order
    assert np.abs(with_lora.images[0].astype(int) - plain.astype(int)).max() > 10
    assert np.array_equal(pipe(**call).images[0], plain)  # the next call is without it again
    with pytest.raises(ValueError, match="lora_mode must be 'fused' or 'runtime'"):
        cubevec.FluxPipeline.from_pretrained(TINYFLUX, lora_mode="later")
    with pytest.raises(FileNotFoundError, match=r"no such file \(lora\)"):
        pipe(**call, lora=str(tmp_path / "missing.safetensors"))
    with pytest.raises(ValueError, match="lora may list at most 16 files"):
        pipe(**call, lora=[str(lora)] * 17)


def test_kontext_folder_edits_the_picture(tmp_path):
    folder = tmp_path / "kontext"
    folder.mkdir()
    for part in ("transformer", "vae", "scheduler", "text_encoder", "tokenizer"):
        os.symlink(os.path.join(TINYFLUX, part), folder / part)
    (folder / "model_index.json").write_text('{"_class_name": "FluxKontextPipeline"}')
    source = cubevec.FluxPipeline.from_pretrained(TINYFLUX)(prompt=PROMPT, generator=1, output_type="np").images[0]
    pipe = cubevec.FluxPipeline.from_pretrained(str(folder))
    out = pipe(prompt="a large yellow square in the center on a blue background", image=source, generator=2, num_inference_steps=4,
               max_area=48 * 48, _auto_resize=False, output_type="np")
    assert out.report["mode"] == "edit" and out.images[0].shape == (48, 48, 3)
    with pytest.raises(TypeError, match="_auto_resize must be a bool"):
        pipe(prompt=PROMPT, image=source, _auto_resize="no")
    with pytest.raises(ValueError, match="strength"):
        pipe(prompt=PROMPT, image=source, strength=0.5, max_area=48 * 48)


def run_script(code, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(code)
    return subprocess.run(["/usr/bin/python3", str(script)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))


def test_exiting_with_a_call_running_in_a_daemon_thread_ends_cleanly(tmp_path):
    r = run_script(f"""
import threading, time, cubevec
pipe = cubevec.FluxPipeline.from_pretrained({TINYFLUX!r})
threading.Thread(target=lambda: pipe(prompt="a red circle", num_inference_steps=200, width=64, height=64, output_type="np"),
                 daemon=True).start()
time.sleep(0.5)
print("exiting")
""", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "exiting" in r.stdout and "terminate called" not in r.stderr


def test_a_forked_child_gets_an_error_not_a_hang(tmp_path):
    r = run_script(f"""
import os, cubevec
pipe = cubevec.FluxPipeline.from_pretrained({TINYFLUX!r})
pipe(prompt="a red circle", num_inference_steps=1, width=32, height=32, output_type="np")
pid = os.fork()
if pid == 0:
    try:
        pipe(prompt="a red circle", num_inference_steps=1, width=32, height=32, output_type="np")
        os._exit(0)
    except cubevec.Error as e:
        print("child:", e)
        os._exit(3)
print("child status", os.waitpid(pid, 0)[1] >> 8)
""", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "do not survive fork()" in r.stdout and "child status 3" in r.stdout, r.stdout


def test_a_forked_child_that_never_calls_in_exits_normally(tmp_path):
    # Its interpreter's exit destroys the pipeline and the layers' device, whose threads stayed in
    # the parent: the destructors must not wait for them (they hung before).
    r = run_script(f"""
import os, sys, numpy as np, cubevec
pipe = cubevec.FluxPipeline.from_pretrained({TINYFLUX!r})
pipe(prompt="a red circle", num_inference_steps=1, width=32, height=32, output_type="np")
cubevec.RMSNorm(8)(np.ones((2, 8), np.float32))
pid = os.fork()
if pid == 0:
    sys.exit(5)
print("child status", os.waitpid(pid, 0)[1] >> 8)
""", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "child status 5" in r.stdout, r.stdout


def test_a_pipeline_made_without_load_is_a_type_error_not_a_crash():
    unloaded = cubevec._cubevec.Pipeline.__new__(cubevec._cubevec.Pipeline)
    with pytest.raises(TypeError, match="not loaded"):
        unloaded.generate('{"prompt": "a red circle"}')
    with pytest.raises(TypeError, match="not loaded"):
        unloaded.family


I2V = os.path.join(SOURCE, "tests", "data", "wan_i2v_tiny")
FLF2V = os.path.join(SOURCE, "tests", "data", "wan_flf2v_tiny")
A14B = os.path.join(SOURCE, "tests", "data", "wan22_tiny_a14b")
FIRST = os.path.join(SOURCE, "tests", "data", "images", "rgb.png")
LAST = os.path.join(SOURCE, "tests", "data", "images", "photo.jpg")
I2V_ARGS = dict(prompt="a red circle moving right", num_inference_steps=2, generator=4, width=48, height=32, num_frames=9)


def test_image_to_video_frames_equal_the_command_lines(tmp_path):
    i2v = cubevec.WanImageToVideoPipeline.from_pretrained(I2V)
    subprocess.run([BINARY, "t2v", "--model", I2V, "--prompt", I2V_ARGS["prompt"], "--image", FIRST, "--steps", "2", "--seed", "4",
                    "--width", "48", "--height", "32", "--frames", "9", "--out", str(tmp_path / "v.avi"), "--frames-dir",
                    str(tmp_path)], check=True, capture_output=True)
    out = i2v(image=FIRST, **I2V_ARGS)
    assert len(out.frames[0]) == 9
    for i, frame in enumerate(out.frames[0]):
        assert np.array_equal(frame, read_png(tmp_path / f"frame_{i:05d}.png")), i
    # The same picture as an array gives the same video; another picture another one.
    as_array = i2v(image=read_png(tmp_path / "frame_00000.png"), **I2V_ARGS)
    assert not np.array_equal(as_array.frames[0][4], out.frames[0][4])
    again = i2v(image=np.array(out.frames[0][0]), **I2V_ARGS)
    assert np.array_equal(again.frames[0][0], as_array.frames[0][0])


def test_first_last_frame_and_two_experts():
    flf = cubevec.WanImageToVideoPipeline.from_pretrained(FLF2V)
    with_last = flf(image=FIRST, last_image=LAST, **I2V_ARGS)
    assert len(with_last.frames[0]) == 9
    a14b = cubevec.WanPipeline.from_pretrained(A14B)
    args = {k: v for k, v in I2V_ARGS.items()}
    one = a14b(guidance_scale=4.0, **args)
    two = a14b(guidance_scale=4.0, guidance_scale_2=1.0, **args)
    assert one.report["boundary_ratio"] == 0.75 and two.report["guidance_2"] == 1.0
    assert not np.array_equal(one.frames[0][8], two.frames[0][8])


def test_image_to_video_errors_name_the_argument():
    i2v = cubevec.WanImageToVideoPipeline.from_pretrained(I2V)
    with pytest.raises(ValueError, match="image is required"):
        i2v(**I2V_ARGS)
    with pytest.raises(ValueError, match="last_image"):  # no first-last-frame table in this checkpoint
        i2v(image=FIRST, last_image=LAST, **I2V_ARGS)
    with pytest.raises(ValueError, match="guidance_scale_2"):
        i2v(image=FIRST, guidance_scale_2=2.0, **I2V_ARGS)
    with pytest.raises(ValueError, match="must be an H x W x 3"):
        i2v(image=np.zeros((4, 4), dtype=np.float32), **I2V_ARGS)
    with pytest.raises(TypeError, match="image must be a path"):
        i2v(image=3, **I2V_ARGS)
    with pytest.raises(ValueError, match="image"):  # a picture for a text-to-video model
        cubevec.WanImageToVideoPipeline.from_pretrained(A14B)(image=FIRST, **I2V_ARGS)
    with pytest.raises(FileNotFoundError, match="does-not-exist.png"):
        i2v(image=os.path.join(SOURCE, "does-not-exist.png"), **I2V_ARGS)


TI2V = os.path.join(SOURCE, "tests", "data", "wan22_ti2v_tiny")
TI2V_ARGS = dict(prompt="a red circle moving right", num_inference_steps=2, generator=4, width=96, height=64, num_frames=9)


def test_wan22_ti2v_with_and_without_a_first_frame(tmp_path):
    """Wan2.2 TI2V (expand_timesteps): WanImageToVideoPipeline with a picture, WanPipeline without, as diffusers
    runs that folder; the command line's frames for the same request."""
    subprocess.run([BINARY, "t2v", "--model", TI2V, "--prompt", TI2V_ARGS["prompt"], "--image", FIRST, "--steps", "2", "--seed",
                    "4", "--width", "96", "--height", "64", "--frames", "9", "--out", str(tmp_path / "v.avi"), "--frames-dir",
                    str(tmp_path)], check=True, capture_output=True)
    with_image = cubevec.WanImageToVideoPipeline.from_pretrained(TI2V)(image=FIRST, **TI2V_ARGS)
    assert len(with_image.frames[0]) == 9
    for i, frame in enumerate(with_image.frames[0]):
        assert np.array_equal(frame, read_png(tmp_path / f"frame_{i:05d}.png")), i
    text_only = cubevec.WanPipeline.from_pretrained(TI2V)(**TI2V_ARGS)
    assert not np.array_equal(text_only.frames[0][0], with_image.frames[0][0])
    with pytest.raises(ValueError, match="first frame only"):
        cubevec.WanImageToVideoPipeline.from_pretrained(TI2V)(image=FIRST, last_image=LAST, **TI2V_ARGS)
    with pytest.raises(ValueError, match="multiples of 16"):
        cubevec.WanPipeline.from_pretrained(TI2V)(**dict(TI2V_ARGS, width=88))


def test_two_experts_quantized_one_description_each(tmp_path):
    """quant= describes transformer/, quant_2= transformer_2/ (cubevec quantize writes both)."""
    subprocess.run([BINARY, "quantize", "--model", A14B, "--algo", "W8A8_DYNAMIC", "--prompt", I2V_ARGS["prompt"], "--steps", "4",
                    "--width", "48", "--height", "32", "--frames", "9", "--out", str(tmp_path)], check=True, capture_output=True)
    first = tmp_path / "quant_model_description_w8a8_dynamic.json"
    second = tmp_path / "transformer_2" / "quant_model_description_w8a8_dynamic.json"
    quantized = cubevec.WanPipeline.from_pretrained(A14B, quant=first, quant_2=second)(**dict(I2V_ARGS, num_inference_steps=4))
    plain = cubevec.WanPipeline.from_pretrained(A14B)(**dict(I2V_ARGS, num_inference_steps=4))
    # int8 stays near float (PSNR over the video, 8-bit levels); each expert quantized changes something.
    error = np.stack([a.astype(np.float64) - b.astype(np.float64) for a, b in zip(quantized.frames[0], plain.frames[0])])
    mse = float((error ** 2).mean())
    assert mse > 0 and 10 * np.log10(255 ** 2 / mse) >= 30, mse
    with pytest.raises(ValueError, match="quant_2 .* needs quant"):
        cubevec.WanPipeline.from_pretrained(A14B, quant_2=second)
    with pytest.raises(cubevec.Error, match="quant .* describes transformer/ only: .* quant_2 FILE for transformer_2/"):
        cubevec.WanPipeline.from_pretrained(A14B, quant=first)
