//! Parts in: conversion, errors, format detection, inference.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, Date32Array, Float32Array, Int32Array, LargeStringArray, StringArray,
    UInt64Array,
};
use serde_json::{json, Value};

use super::*;
use crate::datasets::schema::{Column, ColumnType};
use crate::datasets::table::*;

#[test]
fn bad_rows_name_their_line_and_column() {
    let fx = fixture();
    let schema = five();
    let row_err = |body: &str| {
        let text = format!("{{\"s\":\"ok\"}}\n\n{body}\n{{\"s\":\"after\"}}\n");
        match fx.convert_err("bad.jsonl", text.as_bytes(), PartFormat::Jsonl, &schema) {
            PartError::Row {
                line,
                column,
                message,
            } => (line, column, message),
            other => panic!("{body}: {other:?}"),
        }
    };
    let (line, column, message) = row_err(r#"{"i": "12"}"#);
    assert_eq!((line, column.as_deref()), (3, Some("i")));
    assert!(
        message.contains("expected an integer, got a string"),
        "{message}"
    );
    let (line, column, message) = row_err(r#"{"i": 1.5}"#);
    assert_eq!((line, column.as_deref()), (3, Some("i")));
    assert!(message.contains("1.5"), "{message}");
    let (_, column, _) = row_err(r#"{"i": 2.0}"#);
    assert_eq!(column.as_deref(), Some("i"));
    let (_, column, _) = row_err(r#"{"i": 18446744073709551615}"#);
    assert_eq!(column.as_deref(), Some("i"));
    let (_, column, _) = row_err(r#"{"b": "true"}"#);
    assert_eq!(column.as_deref(), Some("b"));
    let (_, column, _) = row_err(r#"{"s": 1}"#);
    assert_eq!(column.as_deref(), Some("s"));
    let (_, column, _) = row_err(r#"{"f": "1.5"}"#);
    assert_eq!(column.as_deref(), Some("f"));
    let (line, column, message) = row_err(r#"{"s": "x", "extra": 1}"#);
    assert_eq!((line, column.as_deref()), (3, Some("extra")));
    assert!(message.contains("not a column"), "{message}");
    let (line, column, message) = row_err("[1, 2]");
    assert_eq!((line, column), (3, None));
    assert!(message.contains("an array"), "{message}");
    let (_, column, message) = row_err("\"text\"");
    assert_eq!(column, None);
    assert!(message.contains("a string"), "{message}");
    let (line, column, message) = row_err(r#"{"s": "x""#);
    assert_eq!((line, column), (3, None));
    assert!(message.contains("invalid JSON"), "{message}");
    let (_, _, message) = row_err(r#"{"s": "x"} trailing"#);
    assert!(message.contains("invalid JSON"), "{message}");

    let e = fx.convert_err(
        "bad.jsonl",
        b"{\"s\":\"a\"}\n{\"s\":\"\xff\"}\n",
        PartFormat::Jsonl,
        &schema,
    );
    assert!(
        matches!(&e, PartError::Format(m) if m.contains("line 2") && m.contains("UTF-8")),
        "{e:?}"
    );
    let shown = PartError::Row {
        line: 7,
        column: Some("i".into()),
        message: "bad".into(),
    }
    .to_string();
    assert_eq!(shown, "line 7, column `i`: bad");

    // CSV: the header is line 1; a quoted cell spanning lines counts them.
    let csv_err = |text: &str| fx.convert_err("bad.csv", text.as_bytes(), PartFormat::Csv, &schema);
    match csv_err("s,b\na,true\nb,yes\n") {
        PartError::Row {
            line: 3,
            column: Some(c),
            message,
        } => {
            assert_eq!(c, "b");
            assert!(message.contains("yes"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        csv_err("s,b\n\"a\nb\",True\nc,maybe\n"),
        PartError::Row { line: 4, .. }
    ));
    assert!(
        matches!(csv_err("i\n1\n1.5\n"), PartError::Row { line: 3, column: Some(c), .. } if c == "i")
    );
    assert!(
        matches!(csv_err("f\n1.5\nNaN\n"), PartError::Row { line: 3, column: Some(c), .. } if c == "f")
    );
    assert!(
        matches!(csv_err("j\n{}\n{bad\n"), PartError::Row { line: 3, column: Some(c), .. } if c == "j")
    );
    assert!(matches!(
        csv_err("s,b\na,true\nb\n"),
        PartError::Row {
            line: 3,
            column: None,
            ..
        }
    ));
    // A quote never closed swallows the rest of the file into one cell.
    match csv_err("s,b\na,true\n\"b,true\nc,false\nd,true\n") {
        PartError::Row {
            line: 3,
            column: None,
            message,
        } => assert!(message.contains("not closed"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(csv_err("s,nope\na,b\n"), PartError::Format(m) if m.contains("`nope`")));
    assert!(matches!(csv_err("s,s\na,b\n"), PartError::Format(m) if m.contains("twice")));
    let e = fx.convert_err("bad.csv", b"s\n\xff\n", PartFormat::Csv, &schema);
    assert!(matches!(e, PartError::Format(m) if m.contains("UTF-8")));
}

#[test]
fn bad_parquet_parts() {
    let fx = fixture();
    let schema = five();
    let path = fx.dir.path().join("p.parquet");
    let out = fx.dir.path().join("p.out.parquet");
    let err = |path: &Path| convert_part(path, PartFormat::Parquet, &schema, &out).unwrap_err();

    parquet_file(
        &path,
        vec![
            ("s", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
            ("zz", Arc::new(Int32Array::from(vec![1]))),
        ],
    );
    assert!(matches!(err(&path), PartError::Format(m) if m.contains("`zz`")));
    parquet_file(
        &path,
        vec![("i", Arc::new(StringArray::from(vec!["1"])) as ArrayRef)],
    );
    assert!(matches!(err(&path), PartError::Format(m) if m.contains("`i`")));
    parquet_file(
        &path,
        vec![("b", Arc::new(Int32Array::from(vec![1])) as ArrayRef)],
    );
    assert!(matches!(err(&path), PartError::Format(m) if m.contains("`b`")));
    parquet_file(
        &path,
        vec![(
            "i",
            Arc::new(UInt64Array::from(vec![1, u64::MAX])) as ArrayRef,
        )],
    );
    assert!(matches!(err(&path), PartError::Row { line: 2, column: Some(c), .. } if c == "i"));
    parquet_file(
        &path,
        vec![
            (
                "j",
                Arc::new(StringArray::from(vec!["{}", "[]", "{oops"])) as ArrayRef,
            ),
            ("f", Arc::new(Float32Array::from(vec![1.0, f32::NAN, 2.0]))),
        ],
    );
    // The earliest row at fault, whichever column it is in.
    assert!(matches!(err(&path), PartError::Row { line: 2, column: Some(c), .. } if c == "f"));
    assert!(matches!(
        err(&fx.file("not.parquet", b"{\"s\": 1}\n")),
        PartError::Format(_)
    ));

    // Any integer width, a boolean column, fine.
    parquet_file(
        &path,
        vec![
            (
                "i",
                Arc::new(Int32Array::from(vec![Some(-5), None])) as ArrayRef,
            ),
            (
                "b",
                Arc::new(BooleanArray::from(vec![Some(true), Some(false)])),
            ),
        ],
    );
    assert_eq!(
        convert_part(&path, PartFormat::Parquet, &schema, &out)
            .unwrap()
            .rows,
        2
    );
}

#[tokio::test]
async fn parquet_parts_in_every_codec_read() {
    use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
    use parquet::file::properties::WriterProperties;
    let fx = fixture();
    let schema = five();
    let values = ["alpha", "beta", "gamma"];
    for codec in [
        Compression::UNCOMPRESSED,
        Compression::SNAPPY,
        Compression::ZSTD(ZstdLevel::default()),
        Compression::GZIP(GzipLevel::default()),
        Compression::BROTLI(BrotliLevel::default()),
        Compression::LZ4_RAW,
        Compression::LZ4,
    ] {
        let name = format!("{codec:?}").replace(['(', ')', ' ', '{', '}', ':'], "_");
        let path = fx.dir.path().join(format!("{name}.parquet"));
        let batch = RecordBatch::try_from_iter(vec![(
            "s",
            Arc::new(StringArray::from(values.to_vec())) as ArrayRef,
        )])
        .unwrap();
        let props = WriterProperties::builder().set_compression(codec).build();
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let part = fx.store(&name, &path, PartFormat::Parquet, &schema).await;
        let rows = read_all(&fx, &[part], &schema).await;
        let got: Vec<Value> = rows.iter().map(|r| r["s"].clone()).collect();
        assert_eq!(got, values.map(|v| json!(v)), "{codec:?}");
    }
}

#[test]
fn detect_formats() {
    use PartFormat::*;
    assert_eq!(PartFormat::detect(None, None), Jsonl);
    assert_eq!(
        PartFormat::detect(Some("text/csv; charset=utf-8"), None),
        Csv
    );
    assert_eq!(
        PartFormat::detect(Some("application/x-ndjson"), Some("a.csv")),
        Jsonl
    );
    assert_eq!(PartFormat::detect(Some("application/jsonl"), None), Jsonl);
    assert_eq!(PartFormat::detect(Some("application/json"), None), Jsonl);
    assert_eq!(
        PartFormat::detect(Some("application/vnd.apache.parquet"), None),
        Parquet
    );
    assert_eq!(
        PartFormat::detect(Some("application/x-parquet"), None),
        Parquet
    );
    assert_eq!(
        PartFormat::detect(Some("application/octet-stream"), Some("Rows.PARQUET")),
        Parquet
    );
    assert_eq!(
        PartFormat::detect(Some("application/octet-stream"), Some("rows.csv")),
        Csv
    );
    assert_eq!(PartFormat::detect(None, Some("rows.ndjson")), Jsonl);
    assert_eq!(
        PartFormat::detect(Some("application/octet-stream"), Some("rows")),
        Jsonl
    );
    assert_eq!(
        PartFormat::detect(Some("text/plain"), Some("x.tar.gz")),
        Jsonl
    );
}

fn cols(list: &[(&str, ColumnType)]) -> Vec<Column> {
    list.iter()
        .map(|&(name, ty)| Column::new(name, ty))
        .collect()
}

#[test]
fn infer_each_format() {
    use ColumnType::{Boolean, Float, Integer, Json, String as Text};
    let fx = fixture();
    let jsonl = fx.file(
        "i.jsonl",
        br#"{"zeta": 1, "alpha": "x"}

{"alpha": "y", "mid": true, "zeta": 2.5}
{"obj": {"x": 1}, "mixed": 1, "nul": null}
{"mixed": "s", "int": 3}
{"int": -4}
"#,
    );
    assert_eq!(
        infer_schema(&jsonl, PartFormat::Jsonl).unwrap(),
        cols(&[
            ("zeta", Float),
            ("alpha", Text),
            ("mid", Boolean),
            ("obj", Json),
            ("mixed", Json),
            ("nul", Text),
            ("int", Integer),
        ])
    );
    // Only the first 1000 rows count.
    let mut many = "{\"n\": 1}\n".repeat(INFER_ROWS);
    many.push_str("{\"n\": \"late\", \"late\": 1}\n");
    let many = fx.file("many.jsonl", many.as_bytes());
    assert_eq!(
        infer_schema(&many, PartFormat::Jsonl).unwrap(),
        cols(&[("n", Integer)])
    );
    assert!(matches!(
        infer_schema(&fx.file("e.jsonl", b""), PartFormat::Jsonl),
        Err(PartError::Format(_))
    ));
    assert!(matches!(
        infer_schema(&fx.file("x.jsonl", b"{}\n[]\n"), PartFormat::Jsonl),
        Err(PartError::Row { line: 2, .. })
    ));

    let csv = fx.file(
        "i.csv",
        "\u{feff}n,x,t,flag,empty\n1,1.5,hello,TRUE,\n-2,2,world,false,\n,,,,\n".as_bytes(),
    );
    assert_eq!(
        infer_schema(&csv, PartFormat::Csv).unwrap(),
        cols(&[
            ("n", Integer),
            ("x", Float),
            ("t", Text),
            ("flag", Boolean),
            ("empty", Text)
        ])
    );
    assert!(matches!(
        infer_schema(&fx.file("d.csv", b"a,a\n1,2\n"), PartFormat::Csv),
        Err(PartError::Format(_))
    ));

    let parquet = fx.dir.path().join("i.parquet");
    parquet_file(
        &parquet,
        vec![
            ("n", Arc::new(Int32Array::from(vec![1])) as ArrayRef),
            ("u", Arc::new(UInt64Array::from(vec![1]))),
            ("x", Arc::new(Float32Array::from(vec![1.0]))),
            ("t", Arc::new(LargeStringArray::from(vec!["a"]))),
            ("flag", Arc::new(BooleanArray::from(vec![true]))),
        ],
    );
    assert_eq!(
        infer_schema(&parquet, PartFormat::Parquet).unwrap(),
        cols(&[
            ("n", Integer),
            ("u", Integer),
            ("x", Float),
            ("t", Text),
            ("flag", Boolean)
        ])
    );
    parquet_file(
        &parquet,
        vec![("day", Arc::new(Date32Array::from(vec![1])) as ArrayRef)],
    );
    assert!(matches!(
        infer_schema(&parquet, PartFormat::Parquet),
        Err(PartError::Format(m)) if m.contains("`day`")
    ));
}

/// The CSV's byte-order mark is not part of the first column's name.
#[tokio::test]
async fn csv_with_a_byte_order_mark() {
    let fx = fixture();
    let schema = vec![
        Column::new("a", ColumnType::Integer),
        Column::new("b", ColumnType::String),
    ];
    let part = fx
        .store_bytes(
            "bom.csv",
            "\u{feff}a,b\r\n1,x\r\n2,\r\n".as_bytes(),
            PartFormat::Csv,
            &schema,
        )
        .await;
    let rows = read_all(&fx, &[part], &schema).await;
    assert_eq!(
        Value::from(rows.into_iter().map(Value::Object).collect::<Vec<_>>()),
        json!([{"a": 1, "b": "x"}, {"a": 2, "b": null}])
    );
}
