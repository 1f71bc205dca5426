//! JSON-RPC over a pair of byte streams, one envelope per line: how
//! `spool rpc --stdio` serves an editor or an agent host that runs it as a
//! child process (the way MCP servers run). Lines are capped at 1 MiB (a
//! longer one is answered with a parse error and skipped); output goes to
//! the writer only, logs to stderr.

use spool_wire::line::{DEFAULT_MAX_LINE_BYTES, LineCodec};
use spool_wire::rpc::{Envelope, ErrorObject, Id, Response, codes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::dispatch::{Dispatcher, Outgoing};

/// Serves one connection on `input` and `output` until `input` ends; the
/// requests still in progress are answered before it returns.
///
/// # Errors
///
/// When reading `input` or writing `output` fails.
pub async fn serve(
    dispatcher: &Dispatcher,
    mut input: impl AsyncRead + Unpin,
    mut output: impl AsyncWrite + Unpin + Send + 'static,
) -> std::io::Result<()> {
    // A local process, trusted as the user who started it.
    let (connection, mut outgoing) = dispatcher.connect(None);
    let writer = tokio::spawn(async move {
        while let Some(message) = outgoing.recv().await {
            let mut line = message.to_json();
            line.push('\n');
            output.write_all(line.as_bytes()).await?;
            output.flush().await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let mut codec = LineCodec::new(DEFAULT_MAX_LINE_BYTES);
    let mut chunk = vec![0u8; 64 * 1024];
    let read = loop {
        let n = match input.read(&mut chunk).await {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(error) => break Err(error),
        };
        for line in codec.push(&chunk[..n]) {
            take(&connection, line.text).await;
        }
    };
    if let Some(line) = codec.finish() {
        take(&connection, line.text).await;
    }
    connection.close().await;
    // The last sender is gone with the connection: the writer drains and
    // ends.
    drop(connection);
    let written = writer
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    read.and(written)
}

async fn take(connection: &crate::Connection, text: Result<String, spool_wire::line::LineError>) {
    match text {
        Ok(text) => connection.receive(&text).await,
        Err(error) => {
            let refusal = Response::error(
                Id::Null,
                ErrorObject::with_reason(codes::PARSE_ERROR, error.to_string()),
            );
            connection.receive_refusal(Outgoing::One(Envelope::Response(refusal)));
        }
    }
}
