//! Fuzzes the bounded line splitter: any bytes, cut anywhere, split the
//! same way as when fed whole, and no line comes back over the cap.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spool_wire::line::LineCodec;

fuzz_target!(|input: (u8, u16, &[u8])| {
    let (max, cut, data) = input;
    let max = usize::from(max).max(1);
    let cut = usize::from(cut).min(data.len());
    let mut whole = LineCodec::new(max);
    let mut expected = whole.push(data);
    expected.extend(whole.finish());
    let mut pieces = LineCodec::new(max);
    let mut got = pieces.push(&data[..cut]);
    got.extend(pieces.push(&data[cut..]));
    got.extend(pieces.finish());
    assert_eq!(got, expected);
    for line in got {
        if let Ok(text) = line.text {
            assert!(text.len() <= max);
        }
    }
});
