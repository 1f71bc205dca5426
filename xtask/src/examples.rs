//! `cargo xtask examples`: runs the four examples under `examples/` and
//! checks what they print, the way a user trying them would: the embedding
//! host is killed mid-run and started again, the chat channel is talked to
//! over TCP, and the wire-only program's dependency tree is checked for
//! the runtime's crates.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::{cargo, section};

/// How long any expected line may take.
const PATIENCE: Duration = Duration::from_secs(60);

const EXAMPLES: [&str; 4] = [
    "example-embed",
    "example-custom-engine",
    "example-custom-channel",
    "example-wire-only",
];

pub(crate) fn run(root: &Path) -> Result<()> {
    section("examples");
    let mut build = cargo();
    build.args(["build", "--locked"]).current_dir(root);
    for example in EXAMPLES {
        build.args(["-p", example]);
    }
    if !build.status()?.success() {
        bail!("building the examples failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), std::path::PathBuf::from);
    let bin = |name: &str| target.join("debug").join(name);
    embed(&bin("example-embed"), &target)?;
    custom_engine(&bin("example-custom-engine"))?;
    custom_channel(&bin("example-custom-channel"))?;
    wire_only(&bin("example-wire-only"), root)?;
    Ok(())
}

/// Killed right after its tool's write, started again: the run finishes
/// and the write was applied once; a third start has nothing to do.
fn embed(bin: &Path, target: &Path) -> Result<()> {
    let dir = target.join("examples-embed");
    let _ = std::fs::remove_dir_all(&dir);
    let mut child = Command::new(bin)
        .arg(&dir)
        .arg("--hang-after-write")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting example-embed")?;
    let lines = lines_of(&mut child);
    wait_for_line(&lines, |l| l.starts_with("kv_put wrote"))?;
    // The write happened; its completion is not journaled: kill it now.
    child.kill()?;
    child.wait()?;
    let again = output(Command::new(bin).arg(&dir))?;
    expect(
        &again,
        &[
            "resumed 1 run(s)",
            "completed: Saved the greeting.",
            "writes applied in all: 1",
        ],
    )?;
    let third = output(Command::new(bin).arg(&dir))?;
    expect(
        &third,
        &[
            "resumed 0 run(s)",
            "kv_put calls in this process: 0",
            "writes applied in all: 1",
        ],
    )?;
    let _ = std::fs::remove_dir_all(&dir);
    say_ok("embed: killed after its write, restarted, finished with the write applied once");
    Ok(())
}

fn custom_engine(bin: &Path) -> Result<()> {
    let out = output(&mut Command::new(bin))?;
    expect(
        &out,
        &[
            "streamed: The capital of France is Paris.",
            "answer: The capital of France is Paris.",
            "tokens: 6 in, 6 out",
            "unanswerable: failed",
        ],
    )?;
    say_ok("custom-engine: streamed its answer and failed the unanswerable with a code");
    Ok(())
}

/// A user connects, asks, is asked a question, answers in line, and gets
/// the answer streamed.
fn custom_channel(bin: &Path) -> Result<()> {
    let mut child = Command::new(bin)
        .arg("127.0.0.1:0")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting example-custom-channel")?;
    let outcome = (|| -> Result<()> {
        let lines = lines_of(&mut child);
        let first = wait_for_line(&lines, |l| l.starts_with("listening on "))?;
        let addr = first.trim_start_matches("listening on ").trim().to_owned();
        let stream = std::net::TcpStream::connect(&addr)?;
        stream.set_read_timeout(Some(PATIENCE))?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut writer = stream;
        let mut exchange = |send: &str, want: &str| -> Result<()> {
            writeln!(writer, "{send}")?;
            let mut line = String::new();
            reader.read_line(&mut line)?;
            if line.trim_end() != want {
                bail!(
                    "custom-channel: sent `{send}`, expected `{want}`, got `{}`",
                    line.trim_end()
                );
            }
            Ok(())
        };
        exchange("alice", "hello alice")?;
        exchange("deploy please", "bot asks: Which region?")?;
        exchange("eu-west-1", "bot> Deploying to the region you chose.")?;
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    outcome?;
    say_ok("custom-channel: a question answered in line, the answer streamed back");
    Ok(())
}

fn wire_only(bin: &Path, root: &Path) -> Result<()> {
    let out = output(&mut Command::new(bin))?;
    expect(
        &out,
        &[
            "ok bus-request:",
            "ok rpc:",
            "ok http-start:",
            "ok http-event:",
            "ok pod-method:",
            "ok sentinel:",
            "refused bus-request (invalid_request)",
            "sse: id: 1",
            "same for any key order: true",
        ],
    )?;
    let tree = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "tree",
            "--locked",
            "-p",
            "example-wire-only",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(root)
        .output()
        .context("starting cargo tree")?;
    if !tree.status.success() {
        bail!(
            "cargo tree failed: {}",
            String::from_utf8_lossy(&tree.stderr)
        );
    }
    let tree = String::from_utf8(tree.stdout)?;
    for heavy in [
        "tokio ",
        "hyper ",
        "rusqlite ",
        "spool-runtime ",
        "spool-journal ",
    ] {
        if tree.lines().any(|line| line.starts_with(heavy)) {
            bail!(
                "wire-only: depends on {} through spool-wire:\n{tree}",
                heavy.trim()
            );
        }
    }
    say_ok("wire-only: five protocols checked, no runtime, HTTP stack or database in its tree");
    Ok(())
}

/// The child's stdout lines, as they come.
fn lines_of(child: &mut Child) -> Receiver<String> {
    let stdout = child.stdout.take().expect("stdout is piped");
    let (sender, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    lines
}

fn wait_for_line(lines: &Receiver<String>, want: impl Fn(&str) -> bool) -> Result<String> {
    loop {
        let line = lines
            .recv_timeout(PATIENCE)
            .context("the example printed nothing expected in time")?;
        if want(&line) {
            return Ok(line);
        }
    }
}

fn output(command: &mut Command) -> Result<String> {
    let out = command.output().context("starting an example")?;
    if !out.status.success() {
        bail!(
            "an example failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn expect(out: &str, wanted: &[&str]) -> Result<()> {
    for want in wanted {
        if !out.contains(want) {
            bail!("expected `{want}` in the example's output:\n{out}");
        }
    }
    Ok(())
}

fn say_ok(line: &str) {
    crate::say(&format!("ok: {line}"));
}
