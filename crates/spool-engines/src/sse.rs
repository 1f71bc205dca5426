//! A server-sent events reader: bytes in, events out, each line held to a
//! cap so a provider that never ends a line cannot make it buffer without
//! bound.

/// The longest line kept: a whole tool call's arguments can arrive as one
/// `data:` line.
pub(crate) const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// One event: its `event:` name, if any, and its `data:` lines joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) name: Option<String>,
    pub(crate) data: String,
}

/// Reads events as bytes arrive.
#[derive(Debug, Default)]
pub(crate) struct Reader {
    line: Vec<u8>,
    name: Option<String>,
    data: Option<String>,
}

/// A line went over [`MAX_LINE_BYTES`] or was not UTF-8.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("an event stream line is longer than {MAX_LINE_BYTES} bytes")]
    TooLong,
    #[error("an event stream line is not UTF-8")]
    Utf8,
}

impl Reader {
    /// Feeds bytes; returns the events they complete, in order.
    pub(crate) fn push(&mut self, mut bytes: &[u8]) -> Result<Vec<Event>, Error> {
        let mut events = Vec::new();
        while let Some(at) = bytes.iter().position(|&b| b == b'\n') {
            self.extend(&bytes[..at])?;
            bytes = &bytes[at + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8(line).map_err(|_| Error::Utf8)?;
            self.line(&line, &mut events);
        }
        self.extend(bytes)?;
        Ok(events)
    }

    /// The stream ended: the event it was in the middle of, if any.
    pub(crate) fn finish(&mut self) -> Result<Vec<Event>, Error> {
        let mut events = Vec::new();
        if !self.line.is_empty() {
            let line =
                String::from_utf8(std::mem::take(&mut self.line)).map_err(|_| Error::Utf8)?;
            self.line(&line, &mut events);
        }
        self.line("", &mut events);
        Ok(events)
    }

    fn extend(&mut self, bytes: &[u8]) -> Result<(), Error> {
        if self.line.len() + bytes.len() > MAX_LINE_BYTES {
            return Err(Error::TooLong);
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// One line, by the SSE rules: a blank line dispatches, `:` is a
    /// comment, `field: value` loses one space after the colon.
    fn line(&mut self, line: &str, events: &mut Vec<Event>) {
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                events.push(Event {
                    name: self.name.take(),
                    data,
                });
            }
            self.name = None;
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some(("", _)) => return,
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.name = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            // `id` and `retry` are for browsers reconnecting; a model call
            // is never resumed, so they are read and dropped.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(reader: &mut Reader, chunks: &[&[u8]]) -> Vec<Event> {
        let mut events = Vec::new();
        for chunk in chunks {
            events.extend(reader.push(chunk).unwrap());
        }
        events.extend(reader.finish().unwrap());
        events
    }

    #[test]
    fn events_split_anywhere_read_the_same() {
        let text = b"event: message_start\r\ndata: {\"a\":1}\r\n\r\n: keep-alive\n\ndata: one\ndata: two\n\nid: 7\ndata: [DONE]\n\n";
        let whole = all(&mut Reader::default(), &[text]);
        assert_eq!(
            whole,
            vec![
                Event {
                    name: Some("message_start".into()),
                    data: "{\"a\":1}".into()
                },
                Event {
                    name: None,
                    data: "one\ntwo".into()
                },
                Event {
                    name: None,
                    data: "[DONE]".into()
                },
            ]
        );
        for split in 1..text.len() {
            let (a, b) = text.split_at(split);
            assert_eq!(
                all(&mut Reader::default(), &[a, b]),
                whole,
                "split at {split}"
            );
        }
    }

    #[test]
    fn an_event_is_dispatched_as_soon_as_its_blank_line_arrives() {
        let mut reader = Reader::default();
        assert_eq!(reader.push(b"data: x\n").unwrap(), vec![]);
        assert_eq!(reader.push(b"\n").unwrap().len(), 1);
    }

    #[test]
    fn an_endless_line_is_refused_not_buffered() {
        let mut reader = Reader::default();
        let chunk = vec![b'a'; 1024 * 1024];
        let mut refused = false;
        for _ in 0..5 {
            if reader.push(&chunk).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused);
        assert!(reader.line.len() <= MAX_LINE_BYTES);
    }
}
