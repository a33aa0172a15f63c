//! Transcripts of `airlock agent` (table `agent_transcripts`, migration
//! `AGENT_TRANSCRIPTS`): the conversation with the model endpoint as sent and received,
//! redacted of every secret (the API key first) before it is written. Each tool call in
//! it names the run id of its cell, whose record is in `runs`.

use crate::{now_ms, Redactor, Result, Store};
use rusqlite::{params, OptionalExtension};
use serde_json::Value;

/// One finished agent task.
pub struct TranscriptRecord {
    pub model: String,
    /// The endpoint's base URL (never carries the key).
    pub endpoint: String,
    pub task: String,
    /// `answered`, `max_turns`, `deadline`, `model_error`.
    pub outcome: String,
    pub turns: u32,
    pub tool_calls: u32,
    /// The messages, as JSON.
    pub messages: Value,
    /// Values redacted from everything above before it is stored.
    pub secrets: Vec<String>,
}

/// A transcript as stored.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StoredTranscript {
    pub id: String,
    pub started_at: i64,
    pub finished_at: i64,
    pub model: String,
    pub endpoint: String,
    pub task: String,
    pub outcome: String,
    pub turns: u32,
    pub tool_calls: u32,
    pub messages: Value,
}

impl Store {
    /// Stores `record`, redacted; returns its id.
    pub fn record_transcript(&self, started_at: i64, record: TranscriptRecord) -> Result<String> {
        let redactor = Redactor::new(record.secrets);
        let id = uuid::Uuid::now_v7().hyphenated().to_string();
        let messages = redactor.value(record.messages).to_string();
        self.write_tx(|conn| {
            conn.execute(
                "INSERT INTO agent_transcripts (id, started_at, finished_at, model, endpoint, \
                 task, outcome, turns, tool_calls, messages) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    id,
                    started_at,
                    now_ms(),
                    redactor.text(&record.model),
                    redactor.text(&record.endpoint),
                    redactor.text(&record.task),
                    record.outcome,
                    record.turns,
                    record.tool_calls,
                    messages
                ],
            )?;
            Ok(())
        })?;
        Ok(id)
    }

    /// The transcript `id`, if there is one.
    pub fn transcript(&self, id: &str) -> Result<Option<StoredTranscript>> {
        self.read_tx(|conn| {
            let found = conn
                .query_row(
                    "SELECT id, started_at, finished_at, model, endpoint, task, outcome, turns, \
                     tool_calls, messages FROM agent_transcripts WHERE id = ?1",
                    params![id],
                    |row| {
                        let messages: String = row.get(9)?;
                        Ok(StoredTranscript {
                            id: row.get(0)?,
                            started_at: row.get(1)?,
                            finished_at: row.get(2)?,
                            model: row.get(3)?,
                            endpoint: row.get(4)?,
                            task: row.get(5)?,
                            outcome: row.get(6)?,
                            turns: row.get(7)?,
                            tool_calls: row.get(8)?,
                            messages: serde_json::from_str(&messages).unwrap_or(Value::Null),
                        })
                    },
                )
                .optional()?;
            Ok(found)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transcript_is_stored_redacted_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let id = store
            .record_transcript(
                1,
                TranscriptRecord {
                    model: "m".into(),
                    endpoint: "http://127.0.0.1:1/v1".into(),
                    task: "use sk-test-key-123".into(),
                    outcome: "answered".into(),
                    turns: 2,
                    tool_calls: 1,
                    messages: serde_json::json!([{"role": "user", "content": "sk-test-key-123"}]),
                    secrets: vec!["sk-test-key-123".into()],
                },
            )
            .unwrap();
        let stored = store.transcript(&id).unwrap().unwrap();
        assert!(!stored.task.contains("sk-test-key-123"));
        assert!(!stored.messages.to_string().contains("sk-test-key-123"));
        assert_eq!(stored.turns, 2);
    }
}
