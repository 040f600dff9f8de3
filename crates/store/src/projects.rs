//! Projects: what every resource belongs to. One of them is the default
//! project, made on first use and named in the settings.

use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::ids::{self, new_id, now};
use crate::Store;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Project {
    pub id: String,
    pub name: String,
    pub created_at: i64,
}

impl Project {
    fn from_row(row: &AnyRow) -> Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            created_at: row.try_get("created_at")?,
        })
    }
}

/// Whether `id` has the shape of a project id (`project-<ULID>`).
pub fn is_well_formed(id: &str) -> bool {
    ids::is_well_formed(ids::PROJECT, id)
}

impl Store {
    /// A new project; its name must pass [`ids::check_name`].
    pub async fn create_project(&self, name: &str) -> Result<Project> {
        ids::check_name("name", name).map_err(StoreError::Invalid)?;
        let project = Project {
            id: new_id(ids::PROJECT),
            name: name.to_string(),
            created_at: now(),
        };
        sqlx::query("INSERT INTO projects (id, name, created_at) VALUES ($1, $2, $3)")
            .bind(&project.id)
            .bind(&project.name)
            .bind(project.created_at)
            .execute(&self.pool)
            .await?;
        Ok(project)
    }

    pub async fn project(&self, id: &str) -> Result<Option<Project>> {
        let row = sqlx::query("SELECT id, name, created_at FROM projects WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(Project::from_row).transpose()
    }

    pub async fn projects(&self) -> Result<Vec<Project>> {
        let rows = sqlx::query("SELECT id, name, created_at FROM projects ORDER BY id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(Project::from_row).collect()
    }

    /// The default project, made (named "Default") if the store has none.
    pub async fn default_project(&self) -> Result<Project> {
        if let Some(id) = self.setting("default_project").await? {
            if let Some(project) = self.project(&id).await? {
                return Ok(project);
            }
        }
        let made = self.create_project("Default").await?;
        let id = self.setting_or_insert("default_project", &made.id).await?;
        if id != made.id {
            // Another node sharing the store was first: ours is not used.
            sqlx::query("DELETE FROM projects WHERE id = $1")
                .bind(&made.id)
                .execute(&self.pool)
                .await?;
        }
        Ok(self.project(&id).await?.unwrap_or(made))
    }
}
