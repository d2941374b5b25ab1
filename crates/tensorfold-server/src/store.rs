//! Stored responses for `/v1/responses`: each keeps its conversation
//! (prompt messages and reply) so a later request can continue it by
//! `previous_response_id`. Bounded in memory: when full, storing is refused
//! with a clear error rather than forgetting someone's conversation.

use crate::error::ApiError;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;

/// A stored response: the response object and the whole conversation.
#[derive(Debug, Clone)]
pub struct Stored {
    pub response: Value,
    pub conversation: Vec<Value>,
}

pub struct ResponseStore {
    limit: usize,
    entries: Mutex<HashMap<String, Stored>>,
}

impl ResponseStore {
    pub fn new(limit: usize) -> ResponseStore {
        ResponseStore {
            limit,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Stored>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses early when a response could not be stored.
    pub fn check_room(&self) -> Result<(), ApiError> {
        if self.entries().len() >= self.limit {
            return Err(self.full());
        }
        Ok(())
    }

    fn full(&self) -> ApiError {
        ApiError::overloaded(format!(
            "the response store is full ({} responses); delete some with DELETE /v1/responses/{{id}} \
             or send \"store\": false",
            self.limit
        ))
        .code("response_store_full")
        .param("store")
    }

    pub fn insert(&self, id: String, stored: Stored) -> Result<(), ApiError> {
        let mut entries = self.entries();
        if entries.len() >= self.limit {
            return Err(self.full());
        }
        entries.insert(id, stored);
        Ok(())
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        self.entries().get(id).cloned()
    }

    pub fn remove(&self, id: &str) -> bool {
        self.entries().remove(id).is_some()
    }
}

/// The 404 for an id the store does not hold.
pub fn unknown(id: &str, param: &str) -> ApiError {
    ApiError::not_found(format!("No response found with id '{id}'"), "not_found").param(param)
}
