//! Framing: a u32 big-endian length, then that many bytes of JSON.

use crate::Error;

/// Bytes in the length prefix.
pub(crate) const HEADER_LEN: usize = 4;

/// Default cap on one frame's payload (16 MiB), on both sides.
pub(crate) const DEFAULT_MAX_FRAME: usize = 16 << 20;

/// Splits frames off the front of a byte buffer, telling "need more bytes" apart from "this is garbage".
#[derive(Debug, Clone, Copy)]
pub(crate) struct FrameDecoder {
    max_frame: usize,
}

impl FrameDecoder {
    /// A decoder that refuses frames over `max_frame` bytes of payload.
    pub(crate) fn new(max_frame: usize) -> Self {
        Self { max_frame }
    }

    /// The payload length the next frame announces, once its prefix is in `buf`; `Err` when it is over
    /// the cap (as [`FrameDecoder::decode`]).
    pub(crate) fn announced(&self, buf: &[u8]) -> Result<Option<usize>, Error> {
        let Some(header) = buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len > self.max_frame {
            return Err(Error::FrameTooLarge {
                len,
                max: self.max_frame,
            });
        }
        Ok(Some(len))
    }

    /// `Ok(Some(payload))` and the frame removed from `buf`; `Ok(None)` when `buf` holds only part of a frame;
    /// `Err` when the length prefix announces more than the cap (the stream cannot be trusted after that).
    pub(crate) fn decode(&self, buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>, Error> {
        let Some(len) = self.announced(buf)? else {
            return Ok(None);
        };
        if buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        buf.drain(..HEADER_LEN + len);
        Ok(Some(payload))
    }
}

/// The frame for `payload`: length prefix then the bytes.
pub(crate) fn encode(payload: &[u8], max_frame: usize) -> Result<Vec<u8>, Error> {
    if payload.len() > max_frame {
        return Err(Error::FrameTooLarge {
            len: payload.len(),
            max: max_frame,
        });
    }
    let len = u32::try_from(payload.len()).map_err(|_| Error::FrameTooLarge {
        len: payload.len(),
        max: max_frame,
    })?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_header_and_partial_body_need_more_bytes() {
        let d = FrameDecoder::new(100);
        let mut buf = vec![0, 0];
        assert_eq!(d.decode(&mut buf).ok(), Some(None));
        let mut buf = vec![0, 0, 0, 5, b'a'];
        assert_eq!(d.decode(&mut buf).ok(), Some(None));
        assert_eq!(buf.len(), 5, "a partial frame is left in place");
    }

    #[test]
    fn two_frames_in_one_buffer_come_out_in_order() {
        let d = FrameDecoder::new(100);
        let mut buf = encode(b"one", 100).unwrap_or_default();
        buf.extend(encode(b"two", 100).unwrap_or_default());
        assert_eq!(d.decode(&mut buf).ok(), Some(Some(b"one".to_vec())));
        assert_eq!(d.decode(&mut buf).ok(), Some(Some(b"two".to_vec())));
        assert!(buf.is_empty());
    }

    #[test]
    fn oversized_length_prefix_is_an_error_not_a_wait() {
        let d = FrameDecoder::new(10);
        let mut buf = vec![0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            d.decode(&mut buf),
            Err(Error::FrameTooLarge { .. })
        ));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(100_000))]
        /// Any byte soup either yields frames, asks for more, or is refused: it never panics, and every
        /// frame it yields is within the cap and consumed exactly.
        #[test]
        fn decoder_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let d = FrameDecoder::new(16);
            let mut buf = bytes.clone();
            let mut consumed = 0;
            while let Ok(Some(frame)) = d.decode(&mut buf) {
                proptest::prop_assert!(frame.len() <= 16);
                consumed += HEADER_LEN + frame.len();
            }
            proptest::prop_assert_eq!(consumed + buf.len(), bytes.len());
        }

        #[test]
        fn encode_then_decode_round_trips(payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let d = FrameDecoder::new(256);
            let mut buf = encode(&payload, 256).unwrap_or_default();
            proptest::prop_assert_eq!(d.decode(&mut buf).ok(), Some(Some(payload)));
        }
    }
}
