//! The client side of one keep-alive HTTP/1.1 exchange: an answer is complete once its head
//! and `Content-Length` bytes of body have arrived, however the reads split them.

use std::io::{self, Read};

/// A complete answer at the start of `buffer`: its status and how many bytes it took (head and
/// body); `None` while more bytes are needed. An answer without `Content-Length` has no body
/// (as the Python generator reads it); a chunked one, or a head that is not HTTP, is an error.
pub fn parse_response(buffer: &[u8]) -> io::Result<Option<(u16, usize)>> {
    let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buffer[..end])
        .map_err(|_| invalid("an answer's head is not text".to_string()))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| {
            invalid(format!(
                "expected an HTTP/1.x status line, got {status_line:?}"
            ))
        })?;
    let mut length = 0usize;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value
                .parse()
                .map_err(|_| invalid(format!("Content-Length is not a number: {value:?}")))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && !value.eq_ignore_ascii_case("identity")
        {
            return Err(invalid(format!(
                "Transfer-Encoding {value:?} is not read here (expected Content-Length)"
            )));
        }
    }
    let total = end + 4 + length;
    Ok((buffer.len() >= total).then_some((status, total)))
}

/// Reads from `stream` until `buffer` holds a whole answer, takes it out of `buffer` and gives
/// its status. The service closing the connection before the answer is complete is
/// `UnexpectedEof`.
pub fn read_response<R: Read>(stream: &mut R, buffer: &mut Vec<u8>) -> io::Result<u16> {
    let mut chunk = [0u8; 8192];
    loop {
        if let Some((status, taken)) = parse_response(buffer)? {
            buffer.drain(..taken);
            return Ok(status);
        }
        let got = match stream.read(&mut chunk) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if got == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the service closed the connection",
            ));
        }
        buffer.extend_from_slice(&chunk[..got]);
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that hands out its bytes in the given pieces, one per read (a short read).
    struct Pieces(Vec<Vec<u8>>);

    impl Read for Pieces {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Ok(0);
            }
            let piece = &mut self.0[0];
            let n = piece.len().min(out.len());
            out[..n].copy_from_slice(&piece[..n]);
            piece.drain(..n);
            if piece.is_empty() {
                self.0.remove(0);
            }
            Ok(n)
        }
    }

    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
        content-length: 14\r\n\r\n{\"held\": true}";

    #[test]
    fn a_whole_answer_in_one_read() {
        let mut buffer = Vec::new();
        let mut stream = Pieces(vec![ANSWER.to_vec()]);
        assert_eq!(read_response(&mut stream, &mut buffer).unwrap(), 200);
        assert!(buffer.is_empty());
    }

    #[test]
    fn head_split_across_reads() {
        // Split inside the Content-Length line and inside the blank line that ends the head.
        let cut = ANSWER.windows(7).position(|w| w == b"length:").unwrap() + 3;
        let blank = ANSWER.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 2;
        let mut stream = Pieces(vec![
            ANSWER[..cut].to_vec(),
            ANSWER[cut..blank].to_vec(),
            ANSWER[blank..].to_vec(),
        ]);
        let mut buffer = Vec::new();
        assert_eq!(read_response(&mut stream, &mut buffer).unwrap(), 200);
        assert!(buffer.is_empty());
        assert!(stream.0.is_empty(), "every piece was read");
    }

    #[test]
    fn body_split_across_reads_is_waited_for() {
        let head_end = ANSWER.len() - 14;
        let mut pieces = vec![ANSWER[..head_end + 3].to_vec()];
        pieces.extend(ANSWER[head_end + 3..].chunks(2).map(<[u8]>::to_vec));
        let mut stream = Pieces(pieces);
        let mut buffer = Vec::new();
        assert_eq!(read_response(&mut stream, &mut buffer).unwrap(), 200);
        assert!(
            stream.0.is_empty(),
            "the whole body was read before answering"
        );
        // The head alone is not an answer.
        assert_eq!(parse_response(&ANSWER[..head_end]).unwrap(), None);
        assert_eq!(parse_response(&ANSWER[..ANSWER.len() - 1]).unwrap(), None);
        assert_eq!(parse_response(ANSWER).unwrap(), Some((200, ANSWER.len())));
    }

    #[test]
    fn one_byte_at_a_time() {
        let mut stream = Pieces(ANSWER.iter().map(|b| vec![*b]).collect());
        let mut buffer = Vec::new();
        assert_eq!(read_response(&mut stream, &mut buffer).unwrap(), 200);
    }

    #[test]
    fn bytes_after_an_answer_stay_for_the_next() {
        let mut both = b"HTTP/1.1 409 Conflict\r\nContent-Length: 2\r\n\r\n{}".to_vec();
        both.extend_from_slice(ANSWER);
        let mut stream = Pieces(vec![both]);
        let mut buffer = Vec::new();
        assert_eq!(read_response(&mut stream, &mut buffer).unwrap(), 409);
        assert_eq!(buffer, ANSWER);
        assert_eq!(read_response(&mut stream, &mut buffer).unwrap(), 200);
        assert!(buffer.is_empty());
    }

    #[test]
    fn no_content_length_means_no_body() {
        let answer = b"HTTP/1.1 204 No Content\r\nServer: x\r\n\r\n";
        assert_eq!(parse_response(answer).unwrap(), Some((204, answer.len())));
    }

    #[test]
    fn closed_before_the_body_is_an_error() {
        let mut stream = Pieces(vec![ANSWER[..ANSWER.len() - 3].to_vec()]);
        let err = read_response(&mut stream, &mut Vec::new()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn not_http_or_chunked_is_refused() {
        let err = parse_response(b"SSH-2.0-OpenSSH\r\n\r\n").unwrap_err();
        assert!(err.to_string().contains("status line"), "{err}");
        let err = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").unwrap_err();
        assert!(err.to_string().contains("Content-Length"), "{err}");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        let err = parse_response(chunked).unwrap_err();
        assert!(err.to_string().contains("chunked"), "{err}");
    }
}
