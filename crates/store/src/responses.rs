//! Stored responses (`/v1/responses` with `store: true`), per project. The
//! server owns their JSON: the response object as served, this turn's
//! input items, and the whole conversation through the response's output,
//! which a later `previous_response_id` continues from.

use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::Store;

#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// `resp_...` (made by the server).
    pub id: String,
    pub project_id: String,
    pub created_at: i64,
    pub previous_response_id: Option<String>,
    /// The response object.
    pub body: Value,
    /// This turn's input items (a JSON list).
    pub input_items: Value,
    /// The conversation through this response's output (a JSON list).
    pub conversation: Value,
}

const COLUMNS: &str =
    "id, project_id, created_at, previous_response_id, body, input_items, conversation";

fn json(column: &str, row: &AnyRow) -> Result<Value> {
    let text: String = row.try_get(column)?;
    serde_json::from_str(&text)
        .map_err(|e| StoreError::Invalid(format!("stored `{column}` is not JSON: {e}")))
}

impl StoredResponse {
    fn from_row(row: &AnyRow) -> Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            project_id: row.try_get("project_id")?,
            created_at: row.try_get("created_at")?,
            previous_response_id: row.try_get("previous_response_id")?,
            body: json("body", row)?,
            input_items: json("input_items", row)?,
            conversation: json("conversation", row)?,
        })
    }
}

impl Store {
    /// Keeps a response.
    pub async fn create_response(&self, r: &StoredResponse) -> Result<()> {
        self.insert_response(r, "").await.map(drop)
    }

    /// Keeps a response in place of one of the same id and project, if
    /// there is one (a batch line run again after a restart names its
    /// response as the first run did). A response of that id in another
    /// project is left alone and this one is not kept
    /// ([`StoreError::InUse`]).
    pub async fn replace_response(&self, r: &StoredResponse) -> Result<()> {
        let rows = self
            .insert_response(
                r,
                " ON CONFLICT (id) DO UPDATE SET created_at = excluded.created_at, \
             previous_response_id = excluded.previous_response_id, body = excluded.body, \
             input_items = excluded.input_items, conversation = excluded.conversation \
             WHERE responses.project_id = excluded.project_id",
            )
            .await?;
        if rows == 0 {
            return Err(StoreError::InUse(format!(
                "the id {} names a response of another project",
                r.id
            )));
        }
        Ok(())
    }

    /// Inserts `r` (with `on_conflict` after its values); the rows written.
    async fn insert_response(&self, r: &StoredResponse, on_conflict: &str) -> Result<u64> {
        let done = sqlx::query(&format!(
            "INSERT INTO responses ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7){on_conflict}"
        ))
        .bind(&r.id)
        .bind(&r.project_id)
        .bind(r.created_at)
        .bind(r.previous_response_id.clone())
        .bind(r.body.to_string())
        .bind(r.input_items.to_string())
        .bind(r.conversation.to_string())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// The response `id`, in whatever project ([`StoreError::NotFound`] when
    /// missing): the caller checks the project.
    pub async fn response_by_id(&self, id: &str) -> Result<StoredResponse> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM responses WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => StoredResponse::from_row(&row),
            None => Err(StoreError::NotFound("response")),
        }
    }

    /// Deletes the response `id` of `project_id`; NotFound when there is none.
    pub async fn delete_response(&self, project_id: &str, id: &str) -> Result<()> {
        let done = sqlx::query("DELETE FROM responses WHERE project_id = $1 AND id = $2")
            .bind(project_id)
            .bind(id)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound("response"));
        }
        Ok(())
    }
}
