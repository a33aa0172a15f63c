//! The total time bound on a request's body (`server.body_timeout_ms`): the body must be
//! whole within that time of the request's head. A client that sends it slowly, or
//! stops, is answered 408 (`request.body_timeout`) and its connection closed, so it
//! holds a task for at most that long and never a cell: no route starts a cell before
//! its body is whole (every handler takes its body as one buffered value), except
//! `POST /v1/runs/stream`, whose body after its JSON line is the payload's stdin: it
//! bounds that line itself and its stdin is under the run's deadline (stdin_stream.rs).

use crate::error::ApiError;
use axum::body::Body;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Wraps each request's body in its deadline; answers 408 when it fired.
pub async fn bound_body(
    timeout: Duration,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if request.uri().path() == crate::stdin_stream::PATH {
        return next.run(request).await;
    }
    let fired = Arc::new(AtomicBool::new(false));
    let request = request.map(|inner| {
        Body::new(Timed {
            inner,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            fired: Arc::clone(&fired),
        })
    });
    let response = next.run(request).await;
    match fired.load(Ordering::SeqCst) {
        false => response,
        true => {
            let message = format!("the request body did not arrive within {timeout:?}");
            let mut err = ApiError::bad_request("request.body_timeout", message);
            err.status = axum::http::StatusCode::REQUEST_TIMEOUT;
            let mut refused = err.into_response();
            // The rest of the body is not read: the connection cannot carry another
            // request.
            refused.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            refused
        }
    }
}

/// A body that fails once its deadline passes.
struct Timed {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    fired: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
#[error("the request body's deadline passed")]
struct BodyTimedOut;

impl HttpBody for Timed {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.fired.store(true, Ordering::SeqCst);
                Poll::Ready(Some(Err(BodyTimedOut.into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
