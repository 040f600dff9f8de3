//! Query templates of a dataset: ready-made starting points for using it
//! outside Hearth (SQL over an export, the export URLs) and inside it (the
//! fine-tuning request that trains from it, when its columns fit).

use hearth_api::datasets::{QueryTemplate, QueryTemplates, OBJECT_QUERY_TEMPLATES};
use hearth_store::datasets::schema::ColumnType;
use hearth_store::datasets::Dataset;

/// `"name"` with inner quotes doubled (a SQL identifier).
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The templates for `dataset`; `base` is the server's address.
pub fn for_dataset(dataset: &Dataset, base: &str) -> QueryTemplates {
    let columns: Vec<String> = dataset.schema.iter().map(|c| ident(&c.name)).collect();
    let export = |format: &str| format!("{base}/v1/datasets/{}/export?format={format}", dataset.id);
    let mut templates = vec![
        QueryTemplate {
            name: "select_all".into(),
            description: "SQL over the JSON Lines export (DuckDB syntax; the export needs the \
                          `Authorization: Bearer` header, so download it first or set it as an \
                          HTTP header of the reader)."
                .into(),
            query: format!(
                "SELECT {} FROM read_json_auto('{}') LIMIT 100",
                columns.join(", "),
                export("jsonl")
            ),
        },
        QueryTemplate {
            name: "export_csv".into(),
            description: "Every row as CSV with a header row (add `columns=a,b` to choose \
                          columns, `limit=N` to cap rows)."
                .into(),
            query: format!("GET {}", export("csv")),
        },
        QueryTemplate {
            name: "export_jsonl".into(),
            description: "Every row as JSON Lines.".into(),
            query: format!("GET {}", export("jsonl")),
        },
        QueryTemplate {
            name: "content_page".into(),
            description: "One page of rows as JSON (`limit` 1-1000, `offset` from 0).".into(),
            query: format!(
                "GET {base}/v1/datasets/{}/content?limit=100&offset=0",
                dataset.id
            ),
        },
    ];
    let has = |name: &str, types: &[ColumnType]| {
        dataset
            .schema
            .iter()
            .any(|c| c.name == name && types.contains(&c.ty))
    };
    if has("messages", &[ColumnType::Json]) {
        templates.push(QueryTemplate {
            name: "fine_tuning_file".into(),
            description: "The `messages` column as a chat fine-tuning file: one \
                          `{\"messages\": [...]}` object per line; upload it with purpose \
                          `fine-tune`."
                .into(),
            query: format!("GET {}&columns=messages", export("jsonl")),
        });
    } else if has("prompt", &[ColumnType::String]) && has("completion", &[ColumnType::String]) {
        templates.push(QueryTemplate {
            name: "prompt_completion_to_messages".into(),
            description: "SQL turning `prompt`/`completion` rows into chat `messages` \
                          (DuckDB syntax over the JSON Lines export)."
                .into(),
            query: format!(
                "SELECT [{{'role': 'user', 'content': \"prompt\"}}, {{'role': 'assistant', \
                 'content': \"completion\"}}] AS messages FROM read_json_auto('{}')",
                export("jsonl")
            ),
        });
    }
    QueryTemplates {
        object: OBJECT_QUERY_TEMPLATES.to_string(),
        dataset_id: dataset.id.clone(),
        templates,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_store::datasets::schema::Column;

    fn dataset(columns: Vec<Column>) -> Dataset {
        Dataset {
            id: "dataset-1".into(),
            project_id: "p".into(),
            name: "n".into(),
            folder: None,
            description: None,
            schema: columns,
            row_count: 0,
            bytes: 0,
            source: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn templates_name_every_column_and_fit_the_schema() {
        let d = dataset(vec![
            Column::new("prompt", ColumnType::String),
            Column::new("completion", ColumnType::String),
            Column::new("we\"ird", ColumnType::Integer),
        ]);
        let t = for_dataset(&d, "http://h");
        assert_eq!(t.object, "dataset.query_templates");
        let select = &t.templates[0].query;
        assert!(
            select.contains("\"prompt\", \"completion\", \"we\"\"ird\""),
            "{select}"
        );
        assert!(select.contains("http://h/v1/datasets/dataset-1/export?format=jsonl"));
        assert!(t
            .templates
            .iter()
            .any(|t| t.name == "prompt_completion_to_messages"));
        let chat = for_dataset(
            &dataset(vec![Column::new("messages", ColumnType::Json)]),
            "b",
        );
        assert!(chat.templates.iter().any(|t| t.name == "fine_tuning_file"));
        assert!(!chat
            .templates
            .iter()
            .any(|t| t.name == "prompt_completion_to_messages"));
    }
}
