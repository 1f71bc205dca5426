//! Running the real `spool serve` binary: start it on a free port (it says
//! where it listens), stop it with SIGTERM. Shared by the test binaries
//! that drive a server from outside.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub(crate) struct Running {
    pub(crate) child: Reaped,
    pub(crate) addr: String,
    /// What the server said before it listened (pods, the bus, …).
    #[allow(
        dead_code,
        reason = "read by the test binaries that start a bus or pods"
    )]
    pub(crate) notes: Vec<String>,
    /// What it says after that, line by line, for a test to wait on.
    #[allow(
        dead_code,
        reason = "read by the test binaries that wait on a log line"
    )]
    pub(crate) said: std::sync::mpsc::Receiver<String>,
}

/// A server process that is killed when dropped unreaped: a test that
/// fails halfway leaves no `spool serve` behind holding ports and
/// databases.
pub(crate) struct Reaped(Child);

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub(crate) fn serve(dir: &std::path::Path, extra: &[&str]) -> Running {
    serve_with(dir, extra, &[])
}

/// [`serve`] with variables set in the server's environment.
pub(crate) fn serve_with(dir: &std::path::Path, extra: &[&str], vars: &[(&str, &str)]) -> Running {
    serve_on(dir, dir.join("journal").as_os_str(), extra, vars)
}

/// [`serve_with`] on the journal `journal` (a directory or a URL).
pub(crate) fn serve_on(
    dir: &std::path::Path,
    journal: &std::ffi::OsStr,
    extra: &[&str],
    vars: &[(&str, &str)],
) -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["serve", "--addr", "127.0.0.1:0", "--journal"])
        .arg(journal)
        .args(extra)
        .current_dir(dir)
        .env_remove("SPOOL_JOURNAL")
        // The default filter (info), whatever the test's environment says:
        // tests wait on its lines.
        .env_remove("RUST_LOG")
        .envs(vars.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut notes = Vec::new();
    for _ in 0..10 {
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        if let Some(rest) = line.strip_prefix("spool: listening on ") {
            addr = rest.split(' ').next().map(str::to_owned);
            break;
        }
        notes.push(line.trim_end().to_owned());
    }
    // Keep draining stderr so the server never blocks on a full pipe,
    // passing each line on while someone listens.
    let (sender, said) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines() {
            let Ok(line) = line else { return };
            let _ = sender.send(line);
        }
    });
    Running {
        child: Reaped(child),
        addr: addr.expect("the server says where it listens"),
        notes,
        said,
    }
}

pub(crate) fn terminate(running: Running) -> std::process::ExitStatus {
    let Running { mut child, .. } = running;
    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let (sender, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait());
    });
    match exited.recv_timeout(Duration::from_secs(20)) {
        Ok(status) => status.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid]).status();
            panic!("the server did not stop within 20 s of SIGTERM");
        }
    }
}
