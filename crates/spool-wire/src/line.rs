//! A newline-delimited line splitter with a hard cap on line length, for
//! every JSONL/NDJSON reader (Pod sockets, `spool wire validate`).
//!
//! It is pure: the caller feeds bytes from wherever they come and takes
//! lines out. A line longer than the cap is reported once as
//! [`LineError::TooLong`] and its remaining bytes are dropped up to the next
//! newline, so a peer that never sends `\n` cannot make the reader buffer
//! without bound, and the stream recovers at the next line.
//!
//! ```
//! use spool_wire::line::{LineCodec, LineError};
//!
//! let mut codec = LineCodec::new(8);
//! let mut lines = codec.push(b"{\"a\":1}\r\n\n{\"b\":");
//! lines.extend(codec.push(b"2}\nthis line is too long\nok\n"));
//! let texts: Vec<_> = lines.into_iter().map(|l| (l.number, l.text)).collect();
//! assert_eq!(texts, vec![
//!     (1, Ok("{\"a\":1}".to_owned())),
//!     (3, Ok("{\"b\":2}".to_owned())),
//!     (4, Err(LineError::TooLong { max: 8 })),
//!     (5, Ok("ok".to_owned())),
//! ]);
//! ```

/// The default cap: 1 MiB, the largest body any Spool transport accepts.
pub const DEFAULT_MAX_LINE_BYTES: usize = 1024 * 1024;

/// Splits a byte stream into lines of at most `max` bytes.
#[derive(Debug)]
pub struct LineCodec {
    max: usize,
    buf: Vec<u8>,
    /// Dropping the rest of a line that already went over the cap.
    discarding: bool,
    /// The number of the line being read, from 1.
    number: u64,
}

/// One line read, with its 1-based number in the stream (blank lines are
/// skipped but counted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// The line's number.
    pub number: u64,
    /// Its text without the line ending and surrounding whitespace, or why
    /// it could not be read.
    pub text: Result<String, LineError>,
}

/// Why a line could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// The line went over the cap; its bytes were dropped.
    #[error("line longer than {max} bytes")]
    TooLong {
        /// The cap.
        max: usize,
    },
    /// The line is not UTF-8.
    #[error("line is not valid UTF-8")]
    InvalidUtf8,
}

impl Default for LineCodec {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LINE_BYTES)
    }
}

impl LineCodec {
    /// A codec refusing lines over `max` bytes (line ending excluded).
    #[must_use]
    pub fn new(max: usize) -> Self {
        Self {
            max,
            buf: Vec::new(),
            discarding: false,
            number: 1,
        }
    }

    /// The cap.
    #[must_use]
    pub fn max(&self) -> usize {
        self.max
    }

    /// Feeds bytes; returns every line they complete. Never holds more than
    /// `max` bytes of a partial line.
    pub fn push(&mut self, mut bytes: &[u8]) -> Vec<Line> {
        let mut lines = Vec::new();
        while !bytes.is_empty() {
            let (chunk, ended) = match bytes.iter().position(|&b| b == b'\n') {
                Some(at) => (&bytes[..at], true),
                None => (bytes, false),
            };
            bytes = &bytes[(chunk.len() + usize::from(ended)).min(bytes.len())..];
            if !self.discarding {
                // One byte over the cap is held back for a `\r` that may
                // precede the `\n`; `take_line` makes the final call.
                if self.buf.len() + chunk.len() > self.max + 1 {
                    lines.push(Line {
                        number: self.number,
                        text: Err(LineError::TooLong { max: self.max }),
                    });
                    self.buf.clear();
                    self.discarding = true;
                } else {
                    self.buf.extend_from_slice(chunk);
                }
            }
            if ended {
                if !self.discarding {
                    lines.extend(self.take_line());
                }
                self.discarding = false;
                self.buf.clear();
                self.number += 1;
            }
        }
        lines
    }

    /// Ends the stream: the last line, when it had no newline.
    pub fn finish(&mut self) -> Option<Line> {
        let discarding = std::mem::take(&mut self.discarding);
        let line = if discarding { None } else { self.take_line() };
        self.buf.clear();
        line
    }

    /// The buffered line, checked against the cap once its `\r` line ending
    /// is set aside; `None` for a blank line.
    fn take_line(&mut self) -> Option<Line> {
        let mut bytes = std::mem::take(&mut self.buf);
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        let text = if bytes.len() > self.max {
            Err(LineError::TooLong { max: self.max })
        } else {
            match String::from_utf8(bytes) {
                Ok(text) => {
                    let trimmed = text.trim();
                    if trimmed.is_empty() {
                        return None;
                    }
                    Ok(if trimmed.len() == text.len() {
                        text
                    } else {
                        trimmed.to_owned()
                    })
                }
                Err(_) => Err(LineError::InvalidUtf8),
            }
        };
        Some(Line {
            number: self.number,
            text,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(lines: Vec<Line>) -> Vec<Result<String, LineError>> {
        lines.into_iter().map(|l| l.text).collect()
    }

    #[test]
    fn a_line_of_exactly_the_cap_is_accepted_with_or_without_cr() {
        let mut codec = LineCodec::new(4);
        assert_eq!(
            texts(codec.push(b"abcd\nabcd\r\n")),
            vec![Ok("abcd".into()), Ok("abcd".into())]
        );
    }

    #[test]
    fn a_line_one_byte_over_the_cap_is_refused_and_the_next_line_still_reads() {
        let mut codec = LineCodec::new(4);
        assert_eq!(
            texts(codec.push(b"abcde\nok\n")),
            vec![Err(LineError::TooLong { max: 4 }), Ok("ok".into())]
        );
    }

    #[test]
    fn an_endless_line_fed_in_pieces_never_grows_the_buffer_past_the_cap() {
        let mut codec = LineCodec::new(16);
        let mut errors = 0;
        for _ in 0..1000 {
            errors += codec.push(&[b'x'; 1000]).len();
            assert!(codec.buf.len() <= 17);
        }
        assert_eq!(errors, 1, "the overlong line is reported once");
        assert_eq!(texts(codec.push(b"tail\nnext\n")), vec![Ok("next".into())]);
    }

    #[test]
    fn a_final_line_without_newline_is_returned_by_finish() {
        let mut codec = LineCodec::new(16);
        assert!(codec.push(b"{\"a\":").is_empty());
        assert!(codec.push(b"1}").is_empty());
        assert_eq!(codec.finish().map(|l| l.text), Some(Ok("{\"a\":1}".into())));
        assert_eq!(codec.finish(), None);
    }

    #[test]
    fn a_final_line_one_byte_over_the_cap_without_newline_is_refused() {
        // Found by the `line` fuzz target: the byte held back for a `\r`
        // let an unterminated last line through `finish` one byte long.
        let mut codec = LineCodec::new(1);
        assert!(codec.push(b"ab").is_empty());
        assert_eq!(
            codec.finish().map(|l| l.text),
            Some(Err(LineError::TooLong { max: 1 }))
        );
    }

    #[test]
    fn a_line_of_exactly_the_cap_plus_a_carriage_return_is_accepted_at_the_end_of_input() {
        let mut codec = LineCodec::new(2);
        assert!(codec.push(b"ab\r").is_empty());
        assert_eq!(codec.finish().map(|l| l.text), Some(Ok("ab".into())));
    }

    #[test]
    fn invalid_utf8_is_an_error_for_that_line_only() {
        let mut codec = LineCodec::new(16);
        assert_eq!(
            texts(codec.push(b"\xff\xfe\nfine\n")),
            vec![Err(LineError::InvalidUtf8), Ok("fine".into())]
        );
    }

    #[test]
    fn line_numbers_count_blank_lines() {
        let mut codec = LineCodec::new(16);
        let numbers: Vec<u64> = codec
            .push(b"a\n\n \nb\n")
            .into_iter()
            .map(|l| l.number)
            .collect();
        assert_eq!(numbers, vec![1, 4]);
    }
}
