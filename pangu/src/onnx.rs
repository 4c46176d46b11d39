//! The part of the ONNX format the converter reads.
//!
//! [`proto`] declares the messages of `onnx.proto3` that a converter of
//! weights needs, with the ONNX IR's field numbers; prost decodes them and
//! skips every other field. Declaring them here rather than generating the
//! whole schema avoids a build-time `protoc`, and lets every tensor's
//! `raw_data` be a [`Bytes`] slice of the file read once: a 1.1 GB model
//! is held in memory once, not twice. [`Graph`] indexes a decoded graph:
//! who produces and who reads each value, the initializers, and a
//! topological order of the nodes that does not depend on the file's node
//! order.
use crate::error::{Error, Result};
use bytes::Bytes;
use prost::Message;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::Path;

/// The messages of `onnx.proto3` the converter reads (field numbers of the
/// ONNX IR; fields not declared are skipped when decoding).
#[allow(missing_docs)]
pub mod proto {
    use bytes::Bytes;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ModelProto {
        #[prost(int64, tag = "1")]
        pub ir_version: i64,
        #[prost(string, tag = "2")]
        pub producer_name: String,
        #[prost(string, tag = "3")]
        pub producer_version: String,
        #[prost(message, optional, tag = "7")]
        pub graph: Option<GraphProto>,
        #[prost(message, repeated, tag = "8")]
        pub opset_import: Vec<OperatorSetIdProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct OperatorSetIdProto {
        #[prost(string, tag = "1")]
        pub domain: String,
        #[prost(int64, tag = "2")]
        pub version: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GraphProto {
        #[prost(message, repeated, tag = "1")]
        pub node: Vec<NodeProto>,
        #[prost(string, tag = "2")]
        pub name: String,
        #[prost(message, repeated, tag = "5")]
        pub initializer: Vec<TensorProto>,
        /// Sparse initializers, kept undecoded: the converter refuses them.
        #[prost(bytes = "vec", repeated, tag = "15")]
        pub sparse_initializer: Vec<Vec<u8>>,
        #[prost(message, repeated, tag = "11")]
        pub input: Vec<ValueInfoProto>,
        #[prost(message, repeated, tag = "12")]
        pub output: Vec<ValueInfoProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeProto {
        #[prost(string, repeated, tag = "1")]
        pub input: Vec<String>,
        #[prost(string, repeated, tag = "2")]
        pub output: Vec<String>,
        #[prost(string, tag = "3")]
        pub name: String,
        #[prost(string, tag = "4")]
        pub op_type: String,
        #[prost(message, repeated, tag = "5")]
        pub attribute: Vec<AttributeProto>,
        #[prost(string, tag = "7")]
        pub domain: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AttributeProto {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(float, tag = "2")]
        pub f: f32,
        #[prost(int64, tag = "3")]
        pub i: i64,
        #[prost(bytes = "vec", tag = "4")]
        pub s: Vec<u8>,
        #[prost(message, optional, tag = "5")]
        pub t: Option<TensorProto>,
        #[prost(float, repeated, tag = "7")]
        pub floats: Vec<f32>,
        #[prost(int64, repeated, tag = "8")]
        pub ints: Vec<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorProto {
        #[prost(int64, repeated, tag = "1")]
        pub dims: Vec<i64>,
        #[prost(int32, tag = "2")]
        pub data_type: i32,
        #[prost(float, repeated, tag = "4")]
        pub float_data: Vec<f32>,
        #[prost(int64, repeated, tag = "7")]
        pub int64_data: Vec<i64>,
        #[prost(string, tag = "8")]
        pub name: String,
        #[prost(bytes = "bytes", tag = "9")]
        pub raw_data: Bytes,
        #[prost(message, repeated, tag = "13")]
        pub external_data: Vec<StringStringEntryProto>,
        #[prost(int32, tag = "14")]
        pub data_location: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StringStringEntryProto {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueInfoProto {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub r#type: Option<TypeProto>,
    }

    /// `TypeProto`: only its `tensor_type` member of the `value` oneof.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeProto {
        #[prost(message, optional, tag = "1")]
        pub tensor_type: Option<TypeTensor>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeTensor {
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        #[prost(message, optional, tag = "2")]
        pub shape: Option<TensorShapeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorShapeProto {
        #[prost(message, repeated, tag = "1")]
        pub dim: Vec<Dimension>,
    }

    /// A dimension: `dim_value`, or a symbolic `dim_param` (a `oneof`).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dimension {
        #[prost(int64, optional, tag = "1")]
        pub dim_value: Option<i64>,
        #[prost(string, optional, tag = "2")]
        pub dim_param: Option<String>,
    }
}

use proto::{NodeProto, TensorProto, ValueInfoProto};

/// ONNX's element type FLOAT.
pub const FLOAT: i32 = 1;

/// Reads and decodes the model at `path`: the file is read once and every
/// tensor's `raw_data` is a slice of that buffer.
pub fn read(path: &Path) -> Result<proto::ModelProto> {
    let bytes = std::fs::read(path).map_err(Error::io(path))?;
    decode(&path.display().to_string(), Bytes::from(bytes))
}

/// Decodes a model from `bytes` (named `file` in messages).
pub fn decode(file: &str, bytes: Bytes) -> Result<proto::ModelProto> {
    let m = proto::ModelProto::decode(bytes).map_err(|e| Error::Format {
        file: file.into(),
        why: format!("not an ONNX model: {e}"),
    })?;
    if m.graph.is_none() {
        return Err(Error::Format {
            file: file.into(),
            why: "not an ONNX model: no graph".into(),
        });
    }
    Ok(m)
}

/// A tensor's shape, refusing negative dimensions and element counts that
/// overflow.
pub fn dims(t: &TensorProto) -> std::result::Result<Vec<usize>, String> {
    let d: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d}")))
        .collect::<std::result::Result<_, _>>()?;
    d.iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| format!("shape {d:?} overflows"))?;
    Ok(d)
}

/// The little-endian f32 bytes of a FLOAT tensor, `4 * numel` of them:
/// its `raw_data` as it is (no copy), or its `float_data` encoded. Refuses
/// other element types, data stored outside the file, and a data length
/// that does not match the shape.
pub fn f32_bytes(t: &TensorProto) -> std::result::Result<Bytes, String> {
    if t.data_type != FLOAT {
        return Err(format!(
            "element type {} (ONNX code), expected FLOAT (1)",
            t.data_type
        ));
    }
    if t.data_location == 1 || !t.external_data.is_empty() {
        return Err("data stored in an external file, which is not supported".into());
    }
    let d = dims(t)?;
    let n: usize = d.iter().product();
    let bytes = if !t.raw_data.is_empty() {
        t.raw_data.clone()
    } else {
        Bytes::from(
            t.float_data
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
    };
    if Some(bytes.len()) != n.checked_mul(4) {
        return Err(format!(
            "{} data bytes for shape {d:?} ({n} f32 values)",
            bytes.len()
        ));
    }
    Ok(bytes)
}

/// The values of a FLOAT tensor.
pub fn f32_values(t: &TensorProto) -> std::result::Result<Vec<f32>, String> {
    Ok(f32_bytes(t)?
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// A node's attribute.
pub fn attr<'a>(n: &'a NodeProto, name: &str) -> Option<&'a proto::AttributeProto> {
    n.attribute.iter().find(|a| a.name == name)
}

/// The static shape of a graph input or output, if every dimension is a
/// number.
pub fn value_shape(v: &ValueInfoProto) -> Option<Vec<usize>> {
    let s = v.r#type.as_ref()?.tensor_type.as_ref()?.shape.as_ref()?;
    s.dim
        .iter()
        .map(|d| d.dim_value.and_then(|x| usize::try_from(x).ok()))
        .collect()
}

/// A decoded graph, indexed.
pub struct Graph<'m> {
    /// The file (for messages).
    pub file: String,
    /// The nodes, in the file's order.
    pub nodes: &'m [NodeProto],
    /// Node indices in a topological order (ready nodes in file order).
    pub order: Vec<usize>,
    /// Each node's place in [`Graph::order`].
    pub rank: Vec<usize>,
    /// Value name -> the node producing it.
    pub producer: HashMap<&'m str, usize>,
    /// Value name -> the nodes reading it, in file order.
    pub consumers: HashMap<&'m str, Vec<usize>>,
    /// The initializers by name.
    pub inits: HashMap<&'m str, &'m TensorProto>,
    /// The initializers in file order.
    pub init_order: Vec<&'m TensorProto>,
    /// The graph's inputs that are not initializers.
    pub inputs: Vec<&'m ValueInfoProto>,
    /// The graph's outputs.
    pub outputs: Vec<&'m ValueInfoProto>,
}

impl<'m> Graph<'m> {
    /// Indexes `g`. Refuses sparse initializers, duplicate names, a value
    /// that nothing provides (naming the node and the value) and cycles.
    pub fn new(file: &str, g: &'m proto::GraphProto) -> Result<Graph<'m>> {
        let bad = |why: String| Error::Format {
            file: file.into(),
            why,
        };
        if !g.sparse_initializer.is_empty() {
            return Err(bad(
                "the graph has sparse initializers, which are not supported".into(),
            ));
        }
        let mut inits = HashMap::new();
        for t in &g.initializer {
            if inits.insert(t.name.as_str(), t).is_some() {
                return Err(bad(format!("initializer `{}` is defined twice", t.name)));
            }
        }
        let mut producer: HashMap<&str, usize> = HashMap::new();
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, n) in g.node.iter().enumerate() {
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                if producer.insert(o.as_str(), i).is_some() || inits.contains_key(o.as_str()) {
                    return Err(bad(format!(
                        "value `{o}` (output of {} node `{}`) is defined twice",
                        n.op_type, n.name
                    )));
                }
            }
            for x in n.input.iter().filter(|x| !x.is_empty()) {
                consumers.entry(x.as_str()).or_default().push(i);
            }
        }
        let inputs: Vec<&ValueInfoProto> = g
            .input
            .iter()
            .filter(|v| !inits.contains_key(v.name.as_str()))
            .collect();
        // Kahn's algorithm, ready nodes in file order.
        let mut missing = vec![0usize; g.node.len()];
        for (i, n) in g.node.iter().enumerate() {
            for x in n.input.iter().filter(|x| !x.is_empty()) {
                let x = x.as_str();
                if producer.contains_key(x) {
                    missing[i] += 1;
                } else if !inits.contains_key(x) && !inputs.iter().any(|v| v.name == x) {
                    return Err(bad(format!(
                        "{} node `{}` reads `{x}`, which no node, graph input or initializer provides",
                        n.op_type, n.name
                    )));
                }
            }
        }
        let mut ready: BinaryHeap<Reverse<usize>> = (0..g.node.len())
            .filter(|&i| missing[i] == 0)
            .map(Reverse)
            .collect();
        let mut order = Vec::with_capacity(g.node.len());
        while let Some(Reverse(i)) = ready.pop() {
            order.push(i);
            for o in g.node[i].output.iter().filter(|o| !o.is_empty()) {
                for &c in consumers.get(o.as_str()).map(Vec::as_slice).unwrap_or(&[]) {
                    // A node reading the same value twice counted it twice.
                    missing[c] -= 1;
                    if missing[c] == 0 {
                        ready.push(Reverse(c));
                    }
                }
            }
        }
        if order.len() != g.node.len() {
            let stuck = (0..g.node.len()).find(|&i| missing[i] > 0).unwrap_or(0);
            return Err(bad(format!(
                "the graph has a cycle through {} node `{}`",
                g.node[stuck].op_type, g.node[stuck].name
            )));
        }
        let mut rank = vec![0; g.node.len()];
        for (r, &i) in order.iter().enumerate() {
            rank[i] = r;
        }
        Ok(Graph {
            file: file.into(),
            nodes: &g.node,
            order,
            rank,
            producer,
            consumers,
            inits,
            init_order: g.initializer.iter().collect(),
            inputs,
            outputs: g.output.iter().collect(),
        })
    }

    /// The nodes reading `value`.
    pub fn readers(&self, value: &str) -> &[usize] {
        self.consumers.get(value).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The node producing `value`, if a node does.
    pub fn made_by(&self, value: &str) -> Option<&'m NodeProto> {
        self.producer.get(value).map(|&i| &self.nodes[i])
    }

    /// `node` described for messages: `MatMul node `/b1/a12/MatMul``.
    pub fn describe(&self, i: usize) -> String {
        let n = &self.nodes[i];
        format!("{} node `{}`", n.op_type, n.name)
    }

    /// An error about this graph.
    pub fn error(&self, why: String) -> Error {
        Error::Format {
            file: self.file.clone(),
            why,
        }
    }
}
