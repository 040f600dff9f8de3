//! Dataset repository tests: datasets (create, read, list in every order
//! with the `after` cursor, patch, delete) and multipart uploads (parts,
//! complete, idempotent complete, cancel, expiry). Each runs on SQLite, and
//! on PostgreSQL when `HEARTH_TEST_DATABASE_URL` names a server.

#[macro_use]
mod common;

use common::{postgres, sqlite, Env};
use hearth_store::datasets::schema::{Column, ColumnType};
use hearth_store::datasets::{
    part_blob_key, DatasetPatch, DatasetSort, NewDataset, NewUpload, StoredPart, UploadStatus,
};
use hearth_store::{Store, StoreError};

on_both!(
    datasets_are_created_and_read_back,
    lists_page_in_every_order,
    patch_changes_only_descriptive_fields,
    delete_returns_the_part_keys,
    uploads_complete_into_a_dataset,
    complete_is_idempotent_and_checks_its_parts,
    concurrent_completes_answer_as_if_in_turn,
    cancelled_uploads_take_no_parts,
    parts_are_limited,
    stale_uploads_expire,
);

fn schema() -> Vec<Column> {
    vec![
        Column::new("prompt", ColumnType::String),
        Column::new("score", ColumnType::Float),
    ]
}

fn new_dataset(project: &str, name: &str, parts: &[i64]) -> NewDataset {
    NewDataset {
        project_id: project.to_string(),
        name: name.to_string(),
        folder: Some("/eval".to_string()),
        description: None,
        schema: schema(),
        source: None,
        parts: parts
            .iter()
            .enumerate()
            .map(|(i, &rows)| StoredPart {
                blob_key: format!("datasets/{name}/{i}.parquet"),
                rows,
                bytes: rows * 10,
            })
            .collect(),
    }
}

fn new_upload(project: &str) -> NewUpload {
    NewUpload {
        project_id: project.to_string(),
        name: "chats".to_string(),
        folder: None,
        description: Some("support chats".to_string()),
        schema: schema(),
        source: None,
    }
}

/// Adds a part of `rows` rows to `upload`.
async fn part(s: &Store, upload: &str, rows: i64) -> String {
    let id = hearth_store::datasets::new_part_id();
    s.add_upload_part(
        upload,
        &id,
        &part_blob_key(upload, &id),
        rows,
        rows * 10,
        100,
    )
    .await
    .unwrap();
    id
}

async fn datasets_are_created_and_read_back(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let d = s
        .create_dataset(new_dataset(&p, "a", &[3, 4]))
        .await
        .unwrap();
    assert!(d.id.starts_with("dataset-"), "{}", d.id);
    assert!(hearth_store::datasets::is_well_formed_dataset_id(&d.id));
    assert_eq!((d.row_count, d.bytes), (7, 70));
    assert_eq!(d.schema, schema());
    assert_eq!(s.dataset_by_id(&d.id).await.unwrap(), d);
    let parts = s.dataset_parts(&d.id).await.unwrap();
    assert_eq!(
        parts
            .iter()
            .map(|p| (p.key.as_str(), p.rows))
            .collect::<Vec<_>>(),
        vec![("datasets/a/0.parquet", 3), ("datasets/a/1.parquet", 4)]
    );
    assert!(matches!(
        s.dataset_by_id("dataset-01J00000000000000000000000").await,
        Err(StoreError::NotFound(_))
    ));
}

async fn lists_page_in_every_order(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let other = s.create_project("Other").await.unwrap().id;
    // Created in this order; names sort c, a, b, a (a twice: ties by id).
    let mut ids = Vec::new();
    for name in ["c", "a", "b", "a"] {
        ids.push(
            s.create_dataset(new_dataset(&p, name, &[1]))
                .await
                .unwrap()
                .id,
        );
    }
    s.create_dataset(new_dataset(&other, "z", &[1]))
        .await
        .unwrap();
    let project = p.as_str();
    let page = |sort, desc, limit, after: Option<String>| async move {
        let (list, more) = s
            .list_datasets(project, sort, desc, limit, after.as_deref())
            .await
            .unwrap();
        (list.into_iter().map(|d| d.id).collect::<Vec<_>>(), more)
    };
    let by = |order: &[usize]| order.iter().map(|&i| ids[i].clone()).collect::<Vec<_>>();
    // Newest first (the default), then oldest first.
    assert_eq!(
        page(DatasetSort::CreatedAt, true, 10, None).await,
        (by(&[3, 2, 1, 0]), false)
    );
    assert_eq!(
        page(DatasetSort::CreatedAt, false, 10, None).await,
        (by(&[0, 1, 2, 3]), false)
    );
    // Paging with `after` in both orders.
    assert_eq!(
        page(DatasetSort::CreatedAt, true, 2, None).await,
        (by(&[3, 2]), true)
    );
    assert_eq!(
        page(DatasetSort::CreatedAt, true, 2, Some(ids[2].clone())).await,
        (by(&[1, 0]), false)
    );
    assert_eq!(
        page(DatasetSort::CreatedAt, false, 1, Some(ids[2].clone())).await,
        (by(&[3]), false)
    );
    // By name: a (1), a (3), b (2), c (0); descending the reverse.
    assert_eq!(
        page(DatasetSort::Name, false, 10, None).await,
        (by(&[1, 3, 2, 0]), false)
    );
    assert_eq!(
        page(DatasetSort::Name, true, 10, None).await,
        (by(&[0, 2, 3, 1]), false)
    );
    assert_eq!(
        page(DatasetSort::Name, false, 2, Some(ids[1].clone())).await,
        (by(&[3, 2]), true)
    );
    assert_eq!(
        page(DatasetSort::Name, true, 2, Some(ids[3].clone())).await,
        (by(&[1]), false)
    );
    // `after` at the end: an empty page.
    assert_eq!(
        page(DatasetSort::Name, false, 2, Some(ids[0].clone())).await,
        (vec![], false)
    );
    // An `after` of another project is refused.
    let foreign = s
        .list_datasets(&other, DatasetSort::Name, false, 10, None)
        .await
        .unwrap()
        .0;
    assert!(matches!(
        s.list_datasets(&p, DatasetSort::Name, false, 10, Some(&foreign[0].id))
            .await,
        Err(StoreError::Invalid(_))
    ));
}

async fn patch_changes_only_descriptive_fields(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let d = s.create_dataset(new_dataset(&p, "a", &[2])).await.unwrap();
    let patched = s
        .patch_dataset(
            &d.id,
            DatasetPatch {
                name: Some("renamed".into()),
                folder: Some(None),
                description: Some(Some("notes".into())),
            },
        )
        .await
        .unwrap();
    assert_eq!(patched.name, "renamed");
    assert_eq!(patched.folder, None);
    assert_eq!(patched.description.as_deref(), Some("notes"));
    assert_eq!((patched.row_count, patched.schema.clone()), (2, schema()));
    assert!(patched.updated_at >= d.updated_at);
    // An empty patch changes nothing.
    let same = s
        .patch_dataset(&d.id, DatasetPatch::default())
        .await
        .unwrap();
    assert_eq!(
        (same.name, same.description),
        (patched.name, patched.description)
    );
}

async fn delete_returns_the_part_keys(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let d = s
        .create_dataset(new_dataset(&p, "a", &[2, 5]))
        .await
        .unwrap();
    let keys = s.delete_dataset(&d.id).await.unwrap();
    assert_eq!(keys, vec!["datasets/a/0.parquet", "datasets/a/1.parquet"]);
    assert!(matches!(
        s.dataset_by_id(&d.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(s.dataset_parts(&d.id).await.unwrap().is_empty());
    assert!(matches!(
        s.delete_dataset(&d.id).await,
        Err(StoreError::NotFound(_))
    ));
}

async fn uploads_complete_into_a_dataset(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let upload = s.create_upload(new_upload(&p)).await.unwrap();
    assert!(upload.id.starts_with("dsupload-"), "{}", upload.id);
    assert_eq!(upload.status, UploadStatus::Pending);
    let a = part(s, &upload.id, 3).await;
    let b = part(s, &upload.id, 4).await;
    let c = part(s, &upload.id, 5).await;
    // Parts c then a, b left out: the dataset has 8 rows in that order.
    let (done, dataset, left_out) = s
        .complete_upload(&upload.id, &[c.clone(), a.clone()])
        .await
        .unwrap();
    assert_eq!(done.status, UploadStatus::Completed);
    assert!(done.completed_at.is_some());
    assert_eq!(done.dataset_id.as_deref(), Some(dataset.id.as_str()));
    assert_eq!(dataset.row_count, 8);
    assert_eq!(
        (dataset.name.as_str(), dataset.schema.clone()),
        ("chats", schema())
    );
    assert_eq!(dataset.description.as_deref(), Some("support chats"));
    assert_eq!(left_out, vec![part_blob_key(&upload.id, &b)]);
    let parts = s.dataset_parts(&dataset.id).await.unwrap();
    assert_eq!(
        parts.iter().map(|p| p.key.clone()).collect::<Vec<_>>(),
        vec![part_blob_key(&upload.id, &c), part_blob_key(&upload.id, &a)]
    );
    // No more parts once completed.
    let late = hearth_store::datasets::new_part_id();
    assert!(matches!(
        s.add_upload_part(&upload.id, &late, "k", 1, 1, 100).await,
        Err(StoreError::InUse(_))
    ));
}

async fn complete_is_idempotent_and_checks_its_parts(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let upload = s.create_upload(new_upload(&p)).await.unwrap();
    let other = s.create_upload(new_upload(&p)).await.unwrap();
    let a = part(s, &upload.id, 3).await;
    let foreign = part(s, &other.id, 3).await;
    // Unknown, foreign, repeated and empty lists fail and change nothing.
    for bad in [
        vec!["dspart-nope".to_string()],
        vec![foreign.clone()],
        vec![a.clone(), a.clone()],
        vec![],
    ] {
        assert!(
            matches!(
                s.complete_upload(&upload.id, &bad).await,
                Err(StoreError::Invalid(_))
            ),
            "{bad:?}"
        );
    }
    assert_eq!(
        s.upload_by_id(&upload.id).await.unwrap().status,
        UploadStatus::Pending
    );
    let (first, dataset, _) = s
        .complete_upload(&upload.id, std::slice::from_ref(&a))
        .await
        .unwrap();
    let (again, same, left) = s
        .complete_upload(&upload.id, std::slice::from_ref(&a))
        .await
        .unwrap();
    assert_eq!(
        (again, same.id.clone(), left),
        (first, dataset.id.clone(), vec![])
    );
    let (list, _) = s
        .list_datasets(&p, DatasetSort::CreatedAt, true, 10, None)
        .await
        .unwrap();
    assert_eq!(list.len(), 1, "completing twice made one dataset");
    // Another list after completion, or cancelling it, is a conflict.
    let b = hearth_store::datasets::new_part_id();
    assert!(matches!(
        s.complete_upload(&upload.id, &[a.clone(), b]).await,
        Err(StoreError::InUse(_))
    ));
    assert!(matches!(
        s.cancel_upload(&upload.id).await,
        Err(StoreError::InUse(_))
    ));
}

/// Completions racing with different lists: one wins; the others answer
/// as if they came after it (the same list: the same dataset; another:
/// a conflict), never "not a part of the upload" for a part the winner
/// left out and deleted meanwhile.
async fn concurrent_completes_answer_as_if_in_turn(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    for _ in 0..20 {
        let upload = s.create_upload(new_upload(&p)).await.unwrap();
        let a = part(s, &upload.id, 3).await;
        let b = part(s, &upload.id, 4).await;
        let lists = [vec![a.clone()], vec![b.clone()], vec![a.clone()], vec![b]];
        let tasks: Vec<_> = lists
            .into_iter()
            .map(|list| {
                let (s, id) = (s.clone(), upload.id.clone());
                tokio::spawn(async move { (s.complete_upload(&id, &list).await, list) })
            })
            .collect();
        let mut datasets = std::collections::HashSet::new();
        for task in tasks {
            match task.await.unwrap() {
                (Ok((_, dataset, _)), _) => {
                    datasets.insert(dataset.id);
                }
                (Err(StoreError::InUse(_)), _) => {}
                (Err(e), list) => panic!("{list:?}: {e}"),
            }
        }
        assert_eq!(datasets.len(), 1, "one dataset per upload");
    }
}

async fn cancelled_uploads_take_no_parts(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let upload = s.create_upload(new_upload(&p)).await.unwrap();
    let a = part(s, &upload.id, 3).await;
    let (cancelled, keys) = s.cancel_upload(&upload.id).await.unwrap();
    assert_eq!(cancelled.status, UploadStatus::Cancelled);
    assert_eq!(keys, vec![part_blob_key(&upload.id, &a)]);
    // Cancelling again answers the same; parts and completion are refused.
    let (again, keys) = s.cancel_upload(&upload.id).await.unwrap();
    assert_eq!((again.status, keys), (UploadStatus::Cancelled, vec![]));
    let late = hearth_store::datasets::new_part_id();
    assert!(matches!(
        s.add_upload_part(&upload.id, &late, "k", 1, 1, 100).await,
        Err(StoreError::InUse(_))
    ));
    assert!(matches!(
        s.complete_upload(&upload.id, &[a]).await,
        Err(StoreError::InUse(_))
    ));
}

async fn parts_are_limited(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let upload = s.create_upload(new_upload(&p)).await.unwrap();
    for _ in 0..2 {
        let id = hearth_store::datasets::new_part_id();
        s.add_upload_part(&upload.id, &id, "k", 1, 1, 2)
            .await
            .unwrap();
    }
    let id = hearth_store::datasets::new_part_id();
    match s.add_upload_part(&upload.id, &id, "k", 1, 1, 2).await {
        Err(StoreError::InUse(message)) => assert!(message.contains("2 parts"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.upload_parts(&upload.id).await.unwrap().len(), 2);
}

async fn stale_uploads_expire(env: Env) {
    let s = &env.store;
    let p = s.default_project().await.unwrap().id;
    let upload = s.create_upload(new_upload(&p)).await.unwrap();
    let a = part(s, &upload.id, 1).await;
    let done = s.create_upload(new_upload(&p)).await.unwrap();
    let b = part(s, &done.id, 1).await;
    s.complete_upload(&done.id, &[b]).await.unwrap();
    // Nothing is older than an hour ago.
    let now = hearth_store::ids::now();
    assert!(s.expire_uploads(now - 3600).await.unwrap().is_empty());
    // Everything pending before a second from now expires; completed ones stay.
    let keys = s.expire_uploads(now + 1).await.unwrap();
    assert_eq!(keys, vec![part_blob_key(&upload.id, &a)]);
    let expired = s.upload_by_id(&upload.id).await.unwrap();
    assert_eq!(expired.status, UploadStatus::Cancelled);
    assert!(expired.error.unwrap().contains("expired"));
    assert_eq!(
        s.upload_by_id(&done.id).await.unwrap().status,
        UploadStatus::Completed
    );
}
