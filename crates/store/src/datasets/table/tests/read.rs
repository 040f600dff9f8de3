//! Stored parts out: rows read back, exports.

use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array, Int64Array, LargeStringArray, StringArray};
use futures_util::StreamExt;
use serde_json::{Map, Value};

use super::*;
use crate::datasets::schema::{Column, ColumnType};
use crate::datasets::table::*;
use crate::StoreError;

#[tokio::test]
async fn jsonl_csv_and_parquet_parts_read_back_the_same_rows() {
    let fx = fixture();
    let schema = five();
    let rows = sample();

    let jsonl = fx
        .store_bytes("a.jsonl", &jsonl_of(&rows), PartFormat::Jsonl, &schema)
        .await;
    assert_eq!(jsonl.rows, rows.len() as u64);
    assert_eq!(
        read_all(&fx, std::slice::from_ref(&jsonl), &schema).await,
        rows
    );

    let csv = fx
        .store_bytes("a.csv", &csv_of(&schema, &rows), PartFormat::Csv, &schema)
        .await;
    assert_eq!(
        read_all(&fx, std::slice::from_ref(&csv), &schema).await,
        rows
    );

    // Parquet in: other widths and string kinds, JSON text not compact,
    // a schema column missing (null), columns in another order.
    let parquet = fx.dir.path().join("in.parquet");
    let texts: Vec<Option<String>> = rows
        .iter()
        .map(|r| r["s"].as_str().map(str::to_string))
        .collect();
    let json_texts: Vec<Option<String>> = rows
        .iter()
        .map(|r| Some(serde_json::to_string_pretty(&r["j"]).unwrap()))
        .collect();
    parquet_file(
        &parquet,
        vec![
            ("j", Arc::new(StringArray::from(json_texts)) as ArrayRef),
            ("s", Arc::new(LargeStringArray::from(texts))),
            (
                "i",
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r["i"].as_i64()).collect::<Vec<_>>(),
                )),
            ),
            (
                "f",
                Arc::new(Float32Array::from(
                    rows.iter()
                        .map(|r| r["f"].as_f64().filter(|f| f.abs() < 1e30).map(|f| f as f32))
                        .collect::<Vec<_>>(),
                )),
            ),
        ],
    );
    let part = fx
        .store("in.parquet", &parquet, PartFormat::Parquet, &schema)
        .await;
    let mut expected = rows.clone();
    for row in &mut expected {
        row.insert("b".into(), Value::Null);
        if row["f"].as_f64().is_some_and(|f| f.abs() >= 1e30) {
            row.insert("f".into(), Value::Null);
        }
    }
    assert_eq!(read_all(&fx, &[part], &schema).await, expected);

    // Several parts read as one dataset.
    let both = read_all(&fx, &[jsonl, csv], &schema).await;
    assert_eq!(both.len(), 2 * rows.len());
    assert_eq!(both[rows.len()..], rows[..]);
}

#[tokio::test]
async fn stored_parts_are_parquet_with_the_types_named() {
    let fx = fixture();
    let schema = five();
    let part = fx
        .store_bytes("a.jsonl", &jsonl_of(&sample()), PartFormat::Jsonl, &schema)
        .await;
    let size = fx.blobs.size(&part.key).await.unwrap();
    let bytes = fx.blobs.get(&part.key).await.unwrap();
    assert_eq!(size, bytes.len() as u64);
    assert_eq!(&bytes[..4], b"PAR1");
    let tail = fx.blobs.get_range(&part.key, size - 4..size).await.unwrap();
    assert_eq!(&tail[..], b"PAR1");
    assert_eq!(
        &fx.blobs.get_range(&part.key, 1..3).await.unwrap()[..],
        &bytes[1..3]
    );
    assert!(matches!(
        fx.blobs.size("datasets/none").await,
        Err(StoreError::NotFound("blob"))
    ));
    assert!(matches!(
        fx.blobs.get_range("datasets/none", 0..1).await,
        Err(StoreError::NotFound("blob"))
    ));

    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        bytes::Bytes::from(bytes),
    )
    .unwrap();
    let fields = builder.schema().fields().clone();
    let names: Vec<_> = fields.iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["s", "i", "f", "b", "j"]);
    for (field, column) in fields.iter().zip(&schema) {
        assert!(field.is_nullable());
        assert_eq!(field.metadata()[TYPE_KEY], column.ty.as_str());
    }
    let compression = builder.metadata().row_group(0).column(0).compression();
    assert_eq!(compression, parquet::basic::Compression::SNAPPY);
    // Inferring from a stored part keeps `json`.
    let local = fx.file("stored.parquet", &fx.blobs.get(&part.key).await.unwrap());
    assert_eq!(infer_schema(&local, PartFormat::Parquet).unwrap(), schema);
}

#[tokio::test]
async fn empty_parts_and_datasets() {
    let fx = fixture();
    let schema = five();
    let empty = fx
        .store_bytes("e.jsonl", b"\n\n", PartFormat::Jsonl, &schema)
        .await;
    assert_eq!(empty.rows, 0);
    let header_only = fx
        .store_bytes("e.csv", b"s,i\n", PartFormat::Csv, &schema)
        .await;
    assert_eq!(header_only.rows, 0);
    let nothing = fx
        .store_bytes("e0.csv", b"", PartFormat::Csv, &schema)
        .await;
    assert_eq!(nothing.rows, 0);
    let parts = [empty, header_only, nothing];
    assert!(read_all(&fx, &parts, &schema).await.is_empty());
    for parts in [&parts[..], &[][..]] {
        let csv = export_bytes(&fx, parts, &schema, &["s", "i"], ExportFormat::Csv, None).await;
        assert_eq!(csv.concat(), b"s,i\n");
        let jsonl = export_bytes(&fx, parts, &schema, &["s"], ExportFormat::Jsonl, None).await;
        assert!(jsonl.concat().is_empty());
    }
}

#[tokio::test]
async fn exports_parse_back_to_the_rows() {
    let fx = fixture();
    let schema = five();
    let rows = sample();
    let (first, second) = rows.split_at(2);
    let parts = vec![
        fx.store_bytes("1.jsonl", &jsonl_of(first), PartFormat::Jsonl, &schema)
            .await,
        fx.store_bytes("2.csv", &csv_of(&schema, second), PartFormat::Csv, &schema)
            .await,
    ];
    let project = |columns: &[&str], n: usize| -> Vec<Vec<Value>> {
        rows[..n]
            .iter()
            .map(|r| columns.iter().map(|c| r[*c].clone()).collect())
            .collect()
    };
    let ty = |name: &str| schema.iter().find(|c| c.name == name).unwrap().ty;

    for (columns, limit) in [
        (vec!["s", "i", "f", "b", "j"], None),
        (vec!["j", "b", "s"], None),
        (vec!["f", "i"], Some(3)),
        (vec!["s"], Some(0)),
        (vec!["i"], Some(100)),
    ] {
        let n = limit.map_or(rows.len(), |l| (l as usize).min(rows.len()));

        let csv = export_bytes(&fx, &parts, &schema, &columns, ExportFormat::Csv, limit)
            .await
            .concat();
        let mut reader = csv::Reader::from_reader(&csv[..]);
        let header: Vec<String> = reader
            .headers()
            .unwrap()
            .iter()
            .map(str::to_string)
            .collect();
        assert_eq!(header, columns);
        let parsed: Vec<Vec<Value>> = reader
            .records()
            .map(|r| {
                r.unwrap()
                    .iter()
                    .zip(&columns)
                    .map(|(cell, c)| csv_cell(ty(c), cell))
                    .collect()
            })
            .collect();
        assert_eq!(
            parsed,
            project(&columns, n),
            "{}",
            String::from_utf8_lossy(&csv)
        );

        let jsonl = export_bytes(&fx, &parts, &schema, &columns, ExportFormat::Jsonl, limit)
            .await
            .concat();
        let text = String::from_utf8(jsonl).unwrap();
        assert_eq!(text.lines().count(), n);
        for (line, expected) in text.lines().zip(project(&columns, n)) {
            // The keys in the order asked.
            let first_key = format!("{{\"{}\":", columns[0]);
            assert!(line.starts_with(&first_key), "{line}");
            let object: Map<String, Value> = serde_json::from_str(line).unwrap();
            let values: Vec<Value> = columns.iter().map(|c| object[*c].clone()).collect();
            assert_eq!(object.len(), columns.len());
            assert_eq!(values, expected);
        }
    }
    // Booleans and nulls as the spec words them.
    let csv = export_bytes(
        &fx,
        &parts,
        &schema,
        &["b", "s"],
        ExportFormat::Csv,
        Some(3),
    )
    .await
    .concat();
    assert_eq!(
        String::from_utf8(csv)
            .unwrap()
            .lines()
            .take(2)
            .collect::<Vec<_>>(),
        ["b,s", "true,\"héllo, \"\"wörld\"\""]
    );
}

#[tokio::test]
async fn large_parts_skip_to_the_rows_asked() {
    let fx = fixture();
    let schema = vec![
        Column::new("n", ColumnType::Integer),
        Column::new("t", ColumnType::String),
    ];
    const FIRST: u64 = 200_000;
    const SECOND: u64 = 50_000;
    let mut jsonl = Vec::new();
    for n in 0..FIRST {
        jsonl.extend_from_slice(format!("{{\"n\":{n},\"t\":\"r{n}\"}}\n").as_bytes());
    }
    let mut csv = b"t,n\n".to_vec();
    for n in FIRST..FIRST + SECOND {
        csv.extend_from_slice(format!("r{n},{n}\n").as_bytes());
    }
    let parts = vec![
        fx.store_bytes("big.jsonl", &jsonl, PartFormat::Jsonl, &schema)
            .await,
        fx.store_bytes("big.csv", &csv, PartFormat::Csv, &schema)
            .await,
    ];
    assert_eq!((parts[0].rows, parts[1].rows), (FIRST, SECOND));
    let bytes = fx.blobs.get(&parts[0].key).await.unwrap();
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        bytes::Bytes::from(bytes),
    )
    .unwrap();
    let groups: Vec<i64> = builder
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows())
        .collect();
    assert_eq!(groups, [65_536, 65_536, 65_536, 200_000 - 3 * 65_536]);

    let total = FIRST + SECOND;
    let check = |offset: u64, limit: usize, rows: Vec<Map<String, Value>>| {
        let expected: Vec<u64> = (offset..(offset + limit as u64).min(total)).collect();
        let got: Vec<u64> = rows.iter().map(|r| r["n"].as_u64().unwrap()).collect();
        assert_eq!(got, expected, "offset {offset} limit {limit}");
        for row in &rows {
            assert_eq!(row["t"], format!("r{}", row["n"]));
        }
    };
    for (offset, limit) in [
        (0, 3),
        (65_534, 3),
        (65_535, 1),
        (65_536, 1),
        (65_536, 2),
        (131_071, 2),
        (60_000, 10_000),
        (199_998, 5),
        (FIRST, 1),
        (FIRST + 25_000, 10),
        (total - 2, 10),
        (total, 10),
        (total + 100, 10),
        (5, 0),
    ] {
        check(
            offset,
            limit,
            read_rows(&fx.blobs, &parts, &schema, offset, limit)
                .await
                .unwrap(),
        );
    }

    // The export streams in chunks, all of it.
    let chunks = export_bytes(&fx, &parts, &schema, &["n"], ExportFormat::Csv, None).await;
    assert!(chunks.len() > 10, "{} chunks", chunks.len());
    assert!(chunks.iter().all(|c| c.len() < 256 * 1024));
    let text = String::from_utf8(chunks.concat()).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("n"));
    assert!(lines.enumerate().all(|(i, l)| l == i.to_string()));
    assert_eq!(text.lines().count() as u64, total + 1);
    let limited = export_bytes(
        &fx,
        &parts,
        &schema,
        &["t"],
        ExportFormat::Jsonl,
        Some(FIRST + 1),
    )
    .await
    .concat();
    let text = String::from_utf8(limited).unwrap();
    assert_eq!(text.lines().count() as u64, FIRST + 1);
    assert_eq!(
        text.lines().last(),
        Some(format!("{{\"t\":\"r{FIRST}\"}}").as_str())
    );
}

#[tokio::test]
async fn a_missing_blob_ends_the_export_with_an_error() {
    let fx = fixture();
    let schema = five();
    let part = fx
        .store_bytes("a.jsonl", &jsonl_of(&sample()), PartFormat::Jsonl, &schema)
        .await;
    let gone = PartRef {
        key: "datasets/ds-test/gone.parquet".into(),
        rows: 3,
    };
    let results: Vec<_> = export(
        fx.blobs.clone(),
        vec![part.clone(), gone.clone()],
        schema.clone(),
        vec!["s".into()],
        ExportFormat::Jsonl,
        None,
    )
    .collect::<Vec<_>>()
    .await;
    assert!(
        matches!(results.last(), Some(Err(StoreError::NotFound("blob")))),
        "{results:?}"
    );
    assert!(matches!(
        read_rows(&fx.blobs, &[part, gone], &schema, 0, 100).await,
        Err(StoreError::NotFound("blob"))
    ));
}
