//! A throwaway PostgreSQL for the tests: Debian's `postgresql` package
//! (installed with apt-get when missing), a cluster made by `initdb` in a
//! temporary directory, listening on a free loopback port, stopped and
//! deleted when dropped. `cargo xtask ci` runs the tests with one, and
//! `cargo xtask pg -- COMMAND…` runs any command with one, its URL in
//! `JOURNAL_PG_URL`. It offers TLS (the root its certificate chains to in
//! `JOURNAL_PG_CA`), so every connection a test makes without `sslmode`
//! is encrypted, as it would be to a managed database, and admits the
//! role `spool_cert` only with the tests' client certificate.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{free_port, run_tool, say, section};

/// A running throwaway server.
pub(crate) struct Server {
    bin: PathBuf,
    dir: PathBuf,
    /// Run the server's tools as the `postgres` user (we are root, and
    /// PostgreSQL refuses to run as root).
    as_postgres: bool,
    /// Its URL, as `JOURNAL_PG_URL`.
    pub(crate) url: String,
    /// The options it was started with (its port, socket directory, …),
    /// which a start after a stop must give again.
    options: String,
    /// The root its TLS certificate chains to, as `JOURNAL_PG_CA`: the
    /// test server offers TLS (the benchmarks' does not, so their
    /// baselines and Spool speak the same plain protocol).
    pub(crate) ca: Option<PathBuf>,
}

impl Server {
    /// Installs PostgreSQL when missing, and starts a fresh cluster for
    /// tests: without fsync, since a test never survives the machine's
    /// crash, only the server's or a node's, and those keep what the OS
    /// has.
    pub(crate) fn start() -> Result<Self> {
        Self::start_with(false)
    }

    /// [`Server::start`] with fsync as a benchmark needs it: on, so the
    /// figures are a durable database's.
    pub(crate) fn start_durable() -> Result<Self> {
        Self::start_with(true)
    }

    fn start_with(fsync: bool) -> Result<Self> {
        let bin = match find_bin() {
            Some(bin) => bin,
            None => {
                section("installing PostgreSQL from Debian's packages");
                // A fresh image may not have the package lists yet.
                let _ = Command::new("apt-get").arg("update").status();
                run_tool(Command::new("apt-get").args(["install", "-y", "postgresql"]))
                    .context("PostgreSQL is needed by the tests (apt-get install postgresql)")?;
                find_bin().context("apt-get installed postgresql, but no initdb was found")?
            }
        };
        let as_postgres = is_root();
        // Under the system's temporary directory, which the `postgres`
        // user can reach whoever owns the checkout.
        // One directory per server: `ci` runs one for the tests and the
        // benchmarks another, in the same process.
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("spool-pg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let port = free_port()?;
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync={} -c max_connections=300",
            dir.display(),
            if fsync { "on" } else { "off" }
        );
        // The test server offers TLS with the tests' self-signed
        // certificate for `localhost`; its key must be the server user's
        // alone, or PostgreSQL refuses it.
        let ca = if fsync {
            None
        } else {
            let identity = crate::root().join("crates/spool-engines/tests/tls");
            let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
            std::fs::copy(identity.join("localhost.pem"), &cert)
                .context("copying the test TLS certificate")?;
            std::fs::copy(identity.join("localhost.key"), &key)
                .context("copying the test TLS key")?;
            std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            if as_postgres {
                run_tool(Command::new("chown").arg("postgres:").arg(&cert).arg(&key))?;
            }
            // Client certificates signed by the tests' clients' CA are
            // trusted; `pg_hba.conf` (below) admits the role
            // `spool_cert` only with one.
            let clients = dir.join("clients-ca.pem");
            std::fs::copy(identity.join("clients-ca.pem"), &clients)
                .context("copying the test clients' CA")?;
            if as_postgres {
                run_tool(Command::new("chown").arg("postgres:").arg(&clients))?;
            }
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={} -c ssl_ca_file={}",
                cert.display(),
                key.display(),
                clients.display()
            ));
            Some(identity.join("localhost.pem"))
        };
        let server = Self {
            bin,
            dir,
            as_postgres,
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            options,
            ca,
        };
        if as_postgres {
            run_tool(Command::new("chown").arg("postgres:").arg(&server.dir))?;
        }
        let data = server.dir.join("data");
        server.tool(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "--auth=trust".as_ref(),
                "--no-sync".as_ref(),
            ],
        )?;
        if server.ca.is_some() {
            // The first line that matches decides: `spool_cert` over TLS
            // must show a certificate for its name; everyone else is
            // trusted, as `--auth=trust` made it.
            let hba = data.join("pg_hba.conf");
            let trusted = std::fs::read_to_string(&hba).context("reading pg_hba.conf")?;
            std::fs::write(
                &hba,
                format!("hostssl all spool_cert 127.0.0.1/32 cert\n{trusted}"),
            )
            .context("writing pg_hba.conf")?;
        }
        let log = server.dir.join("log");
        server.tool(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-l".as_ref(),
                log.as_os_str(),
                "-w".as_ref(),
                "-o".as_ref(),
                server.options.as_ref(),
                "start".as_ref(),
            ],
        )?;
        say(&format!("PostgreSQL for the tests at {}", server.url));
        Ok(server)
    }

    /// A shell command that restarts the server (a fast shutdown, then a
    /// start with the same options), waiting until it accepts
    /// connections again: what a test of the store surviving a restart
    /// runs, as `JOURNAL_PG_RESTART`.
    pub(crate) fn restart_command(&self) -> String {
        self.pg_ctl("-m fast -w restart")
    }

    /// A shell command that stops the server (a fast shutdown), as
    /// `JOURNAL_PG_STOP`: with [`Server::start_command`], a test can keep
    /// the database away for as long as it needs (past a lease, say).
    pub(crate) fn stop_command(&self) -> String {
        self.pg_ctl("-m fast -w stop")
    }

    /// A shell command that starts the stopped server again with its
    /// options, waiting until it accepts connections, as
    /// `JOURNAL_PG_START`.
    pub(crate) fn start_command(&self) -> String {
        self.pg_ctl(&format!("-w -o '{}' start", self.options))
    }

    /// The variables a test that restarts the server reads.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("JOURNAL_PG_URL", self.url.clone()),
            ("JOURNAL_PG_RESTART", self.restart_command()),
            ("JOURNAL_PG_STOP", self.stop_command()),
            ("JOURNAL_PG_START", self.start_command()),
        ];
        env.extend(self.ca_env());
        env
    }

    /// `JOURNAL_PG_CA`, when the server offers TLS.
    pub(crate) fn ca_env(&self) -> Option<(&'static str, String)> {
        let ca = self.ca.as_ref()?;
        Some(("JOURNAL_PG_CA", ca.display().to_string()))
    }

    /// `pg_ctl` on this server's data directory and log, with `args`, as
    /// one shell command run as the server's user.
    fn pg_ctl(&self, args: &str) -> String {
        let pg_ctl = format!(
            "{} -D {} -l {} {args}",
            self.bin.join("pg_ctl").display(),
            self.dir.join("data").display(),
            self.dir.join("log").display()
        );
        if self.as_postgres {
            format!("runuser -u postgres -- {pg_ctl}")
        } else {
            pg_ctl
        }
    }

    fn tool(&self, name: &str, args: &[&std::ffi::OsStr]) -> Result<()> {
        let path = self.bin.join(name);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&path);
            command
        } else {
            Command::new(&path)
        };
        // Quietly: initdb's and pg_ctl's chatter is not the test's.
        let output = command
            .args(args)
            .current_dir(&self.dir)
            .output()
            .with_context(|| format!("starting {}", path.display()))?;
        if !output.status.success() {
            bail!(
                "{name} failed ({}): {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        if let Err(error) = self.tool(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-m".as_ref(),
                "immediate".as_ref(),
                "stop".as_ref(),
            ],
        ) {
            say(&format!("stopping the test PostgreSQL: {error:#}"));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `cargo xtask pg -- COMMAND…`: COMMAND with a throwaway server.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let command = match args {
        [dash, rest @ ..] if dash == "--" && !rest.is_empty() => rest,
        [] | [_] => bail!("usage: cargo xtask pg -- COMMAND [ARGS…]"),
        rest => rest,
    };
    let server = Server::start()?;
    let status = Command::new(&command[0])
        .args(&command[1..])
        .envs(server.env())
        .env("SPOOL_REQUIRE_PG", "1")
        .status()
        .with_context(|| format!("starting {}", command[0]))?;
    drop(server);
    if !status.success() {
        bail!("{} failed ({status})", command[0]);
    }
    Ok(())
}

/// The newest installed PostgreSQL's programs, as Debian lays them out.
fn find_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}
