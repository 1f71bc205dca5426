//! `spool wire …`: check a peer's messages against Spool's reading of the
//! specs.

use std::io::{Read, Write};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use clap::builder::PossibleValuesParser;
use spool_wire::line::{DEFAULT_MAX_LINE_BYTES, Line, LineCodec};
use spool_wire::validate::{Kind, validate};

#[derive(Debug, Subcommand)]
pub(crate) enum WireCommand {
    /// Read NDJSON messages of one kind from stdin and print, per line,
    /// `{"line":N,"ok":true,"value":…}` with the message re-encoded by Spool,
    /// or `{"line":N,"ok":false,"error":…,"code":…}`. Exits 0 when every
    /// line is valid, 1 otherwise, 2 on a usage error.
    Validate {
        /// The kind of message on every line.
        #[arg(value_parser = PossibleValuesParser::new(Kind::ALL.map(|(_, name)| name)))]
        kind: String,
        /// Refuse lines longer than this many bytes (they are reported, not
        /// buffered).
        #[arg(long, default_value_t = DEFAULT_MAX_LINE_BYTES)]
        max_line_bytes: usize,
    },
}

pub(crate) fn run(command: WireCommand) -> anyhow::Result<ExitCode> {
    match command {
        WireCommand::Validate {
            kind,
            max_line_bytes,
        } => {
            let kind = Kind::from_name(&kind)
                .context("clap admitted a kind the wire crate does not list")?;
            let stdin = std::io::stdin();
            let stdout = std::io::stdout();
            let all_valid =
                validate_stream(kind, max_line_bytes, stdin.lock(), &mut stdout.lock())?;
            Ok(if all_valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

/// Validates every line of `input`, writing one report line each; returns
/// whether all were valid.
fn validate_stream(
    kind: Kind,
    max_line_bytes: usize,
    mut input: impl Read,
    output: &mut impl Write,
) -> anyhow::Result<bool> {
    let mut codec = LineCodec::new(max_line_bytes);
    let mut buf = vec![0u8; 64 * 1024];
    let mut all_valid = true;
    loop {
        let read = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("reading stdin"),
        };
        for line in codec.push(&buf[..read]) {
            all_valid &= report(kind, &line, output)?;
        }
    }
    if let Some(line) = codec.finish() {
        all_valid &= report(kind, &line, output)?;
    }
    output.flush()?;
    Ok(all_valid)
}

/// One refused line, in the field order the command documents.
#[derive(serde::Serialize)]
struct Refused<'a> {
    line: u64,
    ok: bool,
    error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<&'a str>,
}

fn report(kind: Kind, line: &Line, output: &mut impl Write) -> anyhow::Result<bool> {
    let outcome = match &line.text {
        Ok(text) => validate(kind, text).map_err(|invalid| (invalid.message, invalid.code)),
        Err(error) => Err((error.to_string(), None)),
    };
    match outcome {
        // The value is written as Spool encodes it (field order included),
        // not re-serialized through a sorted map.
        Ok(encoded) => {
            writeln!(
                output,
                r#"{{"line":{},"ok":true,"value":{encoded}}}"#,
                line.number
            )?;
            Ok(true)
        }
        Err((error, code)) => {
            let refused = Refused {
                line: line.number,
                ok: false,
                error: &error,
                code: code.as_deref(),
            };
            writeln!(output, "{}", serde_json::to_string(&refused)?)?;
            Ok(false)
        }
    }
}
