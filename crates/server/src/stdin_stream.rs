//! `POST /v1/runs/stream`: a run whose stdin is the rest of the request body. The body is
//! one line of JSON (the run request, as for `POST /v1/runs`, without `stdin`), a
//! newline, then the payload's stdin bytes as they arrive; the end of the body is the
//! end of stdin. The line is bounded like a JSON body (`max_body_bytes`, and
//! `body_timeout_ms` from the request head); the bytes after it are not bounded by
//! `body_timeout_ms` but by the run: they are relayed into the cell as they come, a
//! slow writer is under the run's wall-time deadline, and the body is dropped when the
//! run ends. Nothing is spooled: a cell's stdin is a pipe the relay writes into.

use crate::api::RunBody;
use crate::error::ApiError;
use axum::body::{Body, BodyDataStream, Bytes};
use futures_util::StreamExt;
use std::os::fd::OwnedFd;
use std::time::Duration;

/// Where the route lives: the body deadline middleware leaves it to [`read_head`].
pub const PATH: &str = "/v1/runs/stream";

/// The request line, the stdin bytes that came with it, and the rest of the body.
pub struct Head {
    pub body: RunBody,
    pub first: Bytes,
    pub rest: BodyDataStream,
}

/// Reads the body up to its first newline, within `within` and `max` bytes.
pub async fn read_head(body: Body, max: usize, within: Duration) -> Result<Head, ApiError> {
    let mut rest = body.into_data_stream();
    let mut line = Vec::new();
    let reading = async {
        loop {
            match rest.next().await {
                Some(Ok(chunk)) => {
                    if let Some(end) = chunk.iter().position(|b| *b == b'\n') {
                        line.extend_from_slice(&chunk[..end]);
                        return Ok(chunk.slice(end + 1..));
                    }
                    line.extend_from_slice(&chunk);
                    if line.len() > max {
                        return Err(too_large(max));
                    }
                }
                Some(Err(err)) => {
                    return Err(ApiError::bad_request("request.invalid", err.to_string()))
                }
                None => {
                    return Err(ApiError::bad_request(
                        "request.invalid",
                        "the body ended before the newline after its JSON line".into(),
                    ))
                }
            }
        }
    };
    let first = match tokio::time::timeout(within, reading).await {
        Ok(first) => first?,
        Err(_) => return Err(timed_out(within)),
    };
    if line.len() > max {
        return Err(too_large(max));
    }
    let body = parse_line(&line)?;
    Ok(Head { body, first, rest })
}

/// The JSON line as a run request: strict, and with no `stdin` of its own.
fn parse_line(line: &[u8]) -> Result<RunBody, ApiError> {
    let body: RunBody = serde_json::from_slice(line)
        .map_err(|e| ApiError::bad_request("request.invalid", format!("the JSON line: {e}")))?;
    if body.stdin.is_some() {
        return Err(ApiError::bad_request(
            "stdin.conflict",
            "a streamed run's stdin is the body after the JSON line, not a `stdin` field".into(),
        ));
    }
    Ok(body)
}

fn too_large(max: usize) -> ApiError {
    let mut err = ApiError::bad_request(
        "request.too_large",
        format!("the JSON line is longer than max_body_bytes ({max})"),
    );
    err.status = axum::http::StatusCode::PAYLOAD_TOO_LARGE;
    err
}

fn timed_out(within: Duration) -> ApiError {
    let mut err = ApiError::bad_request(
        "request.body_timeout",
        format!("the JSON line did not arrive within {within:?}"),
    );
    err.status = axum::http::StatusCode::REQUEST_TIMEOUT;
    err
}

/// Writes `first`, then the rest of the body, into the cell's stdin pipe `fd`; closes it
/// at the body's end. Stops, dropping the body, when the run ends or the payload stops
/// reading (the pipe's read end is gone).
pub fn spawn_relay(
    fd: OwnedFd,
    first: Bytes,
    mut rest: BodyDataStream,
    run_ended: tokio::sync::oneshot::Receiver<()>,
) {
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let Ok(mut pipe) = tokio::net::unix::pipe::Sender::from_owned_fd(fd) else {
            return;
        };
        let relay = async {
            if pipe.write_all(&first).await.is_err() {
                return;
            }
            while let Some(Ok(chunk)) = rest.next().await {
                if pipe.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            () = relay => {}
            _ = run_ended => {}
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(parts: &[&'static [u8]]) -> Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
        Body::from_stream(futures_util::stream::iter(chunks))
    }

    async fn head(parts: &[&'static [u8]], max: usize) -> Result<Head, ApiError> {
        read_head(body_of(parts), max, Duration::from_secs(5)).await
    }

    #[tokio::test]
    async fn the_line_may_come_in_pieces_and_what_follows_it_is_stdin() {
        let got = head(
            &[
                b"{\"contract\": \"sm",
                b"all\", \"argv\": [\"cat\"]}\nab",
                b"cd",
            ],
            1024,
        )
        .await
        .unwrap();
        assert_eq!(got.body.contract.as_deref(), Some("small"));
        assert_eq!(got.first, Bytes::from_static(b"ab"));
        let rest: Vec<Bytes> = got.rest.map(|c| c.unwrap()).collect().await;
        assert_eq!(rest, [Bytes::from_static(b"cd")]);
    }

    #[tokio::test]
    async fn a_long_line_a_stdin_field_or_no_newline_is_refused() {
        let reason = |r: Result<Head, ApiError>| r.err().unwrap().body.reason;
        assert_eq!(reason(head(&[&[b'x'; 64]], 16).await), "request.too_large");
        assert_eq!(
            reason(head(&[b"{\"argv\": []", b"           }\n"], 16).await),
            "request.too_large"
        );
        assert_eq!(
            reason(head(&[b"{\"argv\": [], \"stdin\": \"x\"}\n"], 1024).await),
            "stdin.conflict"
        );
        assert_eq!(
            reason(head(&[b"{\"argv\": []}"], 1024).await),
            "request.invalid"
        );
        assert_eq!(
            reason(head(&[b"{\"argv\": [], \"bogus\": 1}\n"], 1024).await),
            "request.invalid"
        );
    }

    #[tokio::test]
    async fn a_line_that_does_not_arrive_in_time_is_408() {
        let stalled =
            Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let err = read_head(stalled, 1024, Duration::from_millis(50))
            .await
            .err()
            .unwrap();
        assert_eq!(
            (err.status.as_u16(), err.body.reason.as_str()),
            (408, "request.body_timeout")
        );
    }
}
