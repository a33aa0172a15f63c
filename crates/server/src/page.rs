//! Bounded list answers: a page holds at most `limit` items (default 100, at most 1000)
//! and at most `MAX_PAGE_BYTES` of JSON (a single larger item still gets a page of its
//! own, or the list could not go on), and names an opaque `next_cursor` when there is
//! more. The page is written item by item into its answer, so a list costs the server
//! one page, whatever the list's length.

use crate::error::ApiError;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;
/// The JSON of one page, bytes (unless its only item is larger).
pub const MAX_PAGE_BYTES: usize = 1 << 20;
/// Room kept for the end of the answer (`],"next_cursor":"..."}`).
const TAIL_BYTES: usize = 1024;

/// `limit` as asked: none is the default, 0 is refused, beyond the maximum is the maximum.
pub fn limit(asked: Option<usize>) -> Result<usize, ApiError> {
    match asked {
        None => Ok(DEFAULT_LIMIT),
        Some(0) => Err(ApiError::bad_request(
            "limit.zero",
            "limit must be at least 1".into(),
        )),
        Some(n) if n > MAX_LIMIT => Err(ApiError::bad_request(
            "query.invalid",
            format!("limit: at most {MAX_LIMIT}"),
        )),
        Some(n) => Ok(n),
    }
}

/// A position in a list of `kind` (`runs`, `sessions`, ...) as the client sees it: opaque
/// (hex), and only good for the list it came from.
pub fn encode_cursor(kind: &str, position: &str) -> String {
    hex::encode(format!("{kind}\n{position}"))
}

/// The position a cursor of `kind` names, or 400 `cursor.invalid`.
pub fn decode_cursor(kind: &str, cursor: &str) -> Result<String, ApiError> {
    let invalid = || {
        ApiError::bad_request(
            "cursor.invalid",
            format!("cursor is not a next_cursor of this list ({kind})"),
        )
    };
    let bytes = hex::decode(cursor).map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    match text.split_once('\n') {
        Some((k, position)) if k == kind && !position.is_empty() => Ok(position.to_string()),
        _ => Err(invalid()),
    }
}

/// One page of a list, written as its items come.
pub struct Page {
    body: Vec<u8>,
    count: usize,
    limit: usize,
}

impl Page {
    /// A page of `field`'s items; `head` are the answer's other fields, written first.
    pub fn new(field: &str, limit: usize, head: &[(&str, &str)]) -> Page {
        let mut body = b"{".to_vec();
        for (name, value) in head {
            // Strings serialize infallibly.
            let _ = serde_json::to_writer(&mut body, name);
            body.push(b':');
            let _ = serde_json::to_writer(&mut body, value);
            body.push(b',');
        }
        let _ = serde_json::to_writer(&mut body, field);
        body.extend_from_slice(b":[");
        Page {
            body,
            count: 0,
            limit,
        }
    }

    /// Whether the page has its `limit` of items.
    pub fn is_full(&self) -> bool {
        self.count >= self.limit
    }

    /// Adds `item` if the page has room for it (its count and its bytes); false if not
    /// (the item is not in the page: the next page starts with it).
    pub fn push(&mut self, item: &impl Serialize) -> Result<bool, ApiError> {
        if self.is_full() {
            return Ok(false);
        }
        let mark = self.body.len();
        if self.count > 0 {
            self.body.push(b',');
        }
        serde_json::to_writer(&mut self.body, item)
            .map_err(|e| ApiError::internal("server.serialize", e.to_string()))?;
        if self.count > 0 && self.body.len() + TAIL_BYTES > MAX_PAGE_BYTES {
            self.body.truncate(mark);
            return Ok(false);
        }
        self.count += 1;
        Ok(true)
    }

    /// About how many more items like the ones so far fit (at least 1; before any item,
    /// `first`): how many to read for it, so records that cannot fit are not read.
    pub fn room_for_more(&self, first: usize) -> usize {
        let left = self.limit.saturating_sub(self.count);
        if self.count == 0 {
            return first.min(left);
        }
        let each = (self.body.len() / self.count).max(1);
        let bytes_left = MAX_PAGE_BYTES.saturating_sub(self.body.len() + TAIL_BYTES);
        (bytes_left / each).clamp(1, left.max(1))
    }

    /// The answer: the items, and `next_cursor` when the list goes on.
    pub fn finish(mut self, next_cursor: Option<String>) -> Response {
        self.body.push(b']');
        if let Some(cursor) = next_cursor {
            self.body.extend_from_slice(b",\"next_cursor\":");
            let _ = serde_json::to_writer(&mut self.body, &cursor);
        }
        self.body.push(b'}');
        self.body.shrink_to_fit();
        ([(CONTENT_TYPE, "application/json")], self.body).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_comes_back_as_its_position_only_for_its_list() {
        let c = encode_cursor("runs", "17:abc");
        assert_eq!(decode_cursor("runs", &c).unwrap(), "17:abc");
        let err = decode_cursor("sessions", &c).err().unwrap();
        assert_eq!(
            (err.status.as_u16(), err.body.reason.as_str()),
            (400, "cursor.invalid")
        );
        for garbage in [
            "",
            "zz",
            "00",
            &hex::encode("runs\n"),
            &hex::encode([0xff, 0xfe]),
        ] {
            assert!(decode_cursor("runs", garbage).is_err(), "{garbage}");
        }
    }

    #[test]
    fn a_page_ends_at_its_count_or_its_bytes_but_holds_at_least_one_item() {
        let mut page = Page::new("items", 3, &[("dir", "/w")]);
        for i in 0..3 {
            assert!(page.push(&i).unwrap());
        }
        assert!(page.is_full() && !page.push(&4).unwrap());
        let big = "x".repeat(MAX_PAGE_BYTES / 3);
        let mut page = Page::new("items", 1000, &[]);
        assert!(page.push(&big).unwrap());
        assert!(page.push(&big).unwrap());
        assert!(!page.push(&big).unwrap(), "a third would pass the cap");
        assert_eq!(page.count, 2);
        let huge = "x".repeat(2 * MAX_PAGE_BYTES);
        let mut alone = Page::new("items", 1000, &[]);
        assert!(alone.push(&huge).unwrap(), "a page of its own");
        assert_eq!(alone.room_for_more(4), 1);
        let mut small = Page::new("items", 1000, &[]);
        assert_eq!(small.room_for_more(4), 4);
        small.push(&"x".repeat(MAX_PAGE_BYTES / 4)).unwrap();
        assert_eq!(small.room_for_more(4), 2);
        assert!(!alone.push(&1).unwrap());
    }

    #[test]
    fn the_answer_is_json_with_the_cursor_when_the_list_goes_on() {
        let mut page = Page::new("items", 10, &[("dir", "/w\"x")]);
        page.push(&serde_json::json!({"a": 1})).unwrap();
        let response = page.finish(Some("ab".into()));
        let body = futures_body(response);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"dir": "/w\"x", "items": [{"a": 1}], "next_cursor": "ab"})
        );
    }

    fn futures_body(response: Response) -> Vec<u8> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap()
                .to_vec()
        })
    }
}
