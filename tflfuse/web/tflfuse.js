// tflfuse.js: runs a model exported by `tflfuse export MODEL.tflite --web DIR` on WebGPU. No dependencies.
//
//   import {load} from "./tflfuse.js";
//   const model = await load("model/");            // plan.json, weights.bin, shaders/*.wgsl; pipelines built once
//   model.inputs; model.outputs;                    // [{name, shape, dtype}]
//   const outs = await model.run([float32Array]);   // one typed array per output, in output order
//   await model.run({input_name: float32Array});    // inputs by name
//   model.device;                                    // the GPUDevice
//
// The folder holds the plan as data (tflfuse/runtime/serialize.py describes plan.json): buffers, and per dispatch
// its shader, entry point, dispatch size, bindings and uniform bytes. This file only executes it: one command
// buffer per run, every dispatch in one compute pass, then copies of the outputs to read-back buffers.

/** Every error of this module: a message naming the input, limit, feature or file and what to do. */
export class TflfuseError extends Error {
  constructor(message) { super(message); this.name = "TflfuseError"; }
}

// dtype (the model file's) -> the typed array users give and get it in.
const ARRAYS = {float32: Float32Array, int32: Int32Array, bool: Uint8Array, int64: BigInt64Array};
const FORMAT = "tflfuse-plan", VERSION = 1;

/**
 * Loads an exported model.
 * @param {string|URL} url the export folder (ending in "/" or not).
 * @param {{device?: GPUDevice, adapter?: GPURequestAdapterOptions}} [options] a device to share (it must have the
 *   plan's features and limits), or options for requestAdapter.
 * @returns {Promise<Model>}
 * @throws {TflfuseError} no navigator.gpu, no adapter, a missing feature (shader-f16) or a limit the adapter
 *   lacks, a file that cannot be fetched, a shader that does not compile.
 */
export async function load(url, options = {}) {
  const base = new URL(String(url).endsWith("/") ? url : `${url}/`, globalThis.location?.href);
  const plan = await fetchFile(base, "plan.json", r => r.json());
  if (plan.format !== FORMAT || plan.version !== VERSION) {
    throw new TflfuseError(`${base}plan.json is not a ${FORMAT} version ${VERSION} file (got ${plan.format} ` +
                           `version ${plan.version}); export the model again with this tflfuse.js`);
  }
  const device = options.device ?? await requestDevice(plan.requires, options.adapter);
  const [weights, shaders] = await Promise.all([
    fetchFile(base, "weights.bin", r => r.arrayBuffer()),
    Promise.all(plan.shaders.map(name => fetchFile(base, `shaders/${name}`, r => r.text()))),
  ]);
  if (weights.byteLength !== plan.weights_size) {
    throw new TflfuseError(`${base}weights.bin has ${weights.byteLength} bytes, plan.json says ` +
                           `${plan.weights_size}: the folder holds files of two exports`);
  }
  const model = new Model(plan, device);
  await model._build(new Uint8Array(weights), shaders);
  return model;
}

async function fetchFile(base, name, read) {
  const where = new URL(name, base);
  let response;
  try {
    response = await fetch(where);
  } catch (e) {
    throw new TflfuseError(`cannot fetch ${where}: ${e.message}`);
  }
  if (!response.ok) throw new TflfuseError(`cannot fetch ${where}: HTTP ${response.status}`);
  return read(response);
}

async function requestDevice(requires, adapterOptions) {
  if (!globalThis.navigator?.gpu) {
    throw new TflfuseError("WebGPU is not available: navigator.gpu is missing. Use a browser with WebGPU " +
                           "(Chrome or Edge 113+, Safari 26+, Firefox 141+ on Windows) and serve the page " +
                           "over https or from localhost (WebGPU needs a secure context)");
  }
  const adapter = await navigator.gpu.requestAdapter(adapterOptions);
  if (!adapter) throw new TflfuseError("navigator.gpu.requestAdapter() found no WebGPU adapter (is WebGPU disabled?)");
  const name = describeAdapter(adapter.info);
  for (const feature of requires.features) {
    if (!adapter.features.has(feature)) {
      throw new TflfuseError(`the model needs the WebGPU feature "${feature}", which the adapter ${name} does not ` +
                             `offer; export it with precision float32 for this adapter`);
    }
  }
  for (const [limit, need] of Object.entries(requires.limits)) {
    if (adapter.limits[limit] !== undefined && adapter.limits[limit] < need) {
      throw new TflfuseError(`the model needs the WebGPU limit ${limit} >= ${need}; the adapter ${name} offers ` +
                             `${adapter.limits[limit]}`);
    }
  }
  const requiredLimits = Object.fromEntries(Object.entries(requires.limits)
    .filter(([limit, need]) => adapter.limits[limit] !== undefined && need > 0));
  return adapter.requestDevice({requiredFeatures: requires.features, requiredLimits});
}

function describeAdapter(info) {
  if (!info) return "(unknown)";
  return [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" ") || "(unnamed)";
}

/** A loaded model: {@link Model#run} runs it; inputs and outputs describe its tensors. */
class Model {
  constructor(plan, device) {
    this.plan = plan;
    this.device = device;
    this.inputs = plan.inputs.map(({name, shape, dtype}) => ({name, shape, dtype}));
    this.outputs = plan.outputs.map(({name, shape, dtype}) => ({name, shape, dtype}));
    this.signatures = plan.signatures;
    this.lost = null;   // the GPUDeviceLostInfo once the device is lost
    device.lost.then(info => { this.lost = info; });
    this._queue = Promise.resolve();   // runs one after another: they share buffers
  }

  /** The adapter's description ("google swiftshader", a GPU's name) where the browser tells it. */
  get adapterName() { return describeAdapter(this.device.adapterInfo); }

  async _build(weights, sources) {
    const {device, plan} = this;
    const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
    device.pushErrorScope("validation");
    this._buffers = plan.buffers.map(b => device.createBuffer({size: b.size, usage: STORAGE, label: b.label}));
    plan.buffers.forEach((b, i) => {
      if (b.kind === "weights") device.queue.writeBuffer(this._buffers[i], 0, weights, b.weights_offset, b.size);
    });
    const modules = sources.map((code, i) => device.createShaderModule({code, label: plan.shaders[i]}));
    const pipelines = new Map();
    const pipeline = d => {
      const key = `${d.shader}:${d.entry_point}`;
      if (!pipelines.has(key)) {
        pipelines.set(key, device.createComputePipelineAsync({
          layout: "auto", label: plan.shaders[d.shader],
          compute: {module: modules[d.shader], entryPoint: d.entry_point},
        }).catch(e => {
          throw new TflfuseError(`shaders/${plan.shaders[d.shader]} (${d.op}, operator ${d.operator}) does not ` +
                                 `compile on ${this.adapterName}: ${e.message}`);
        }));
      }
      return pipelines.get(key);
    };
    const compiled = await Promise.all(plan.dispatches.map(pipeline));
    this._steps = plan.dispatches.map((d, i) => {
      const entries = d.bindings.map(b => ({binding: b.binding, resource: {
        buffer: this._buffers[b.buffer], offset: b.offset, size: b.size}}));
      if (d.uniform) {
        const bytes = hexBytes(d.uniform.bytes);
        const usage = GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST;
        const buffer = device.createBuffer({size: bytes.byteLength, usage});
        device.queue.writeBuffer(buffer, 0, bytes);
        entries.push({binding: d.uniform.binding, resource: {buffer}});
      }
      const group = device.createBindGroup({layout: compiled[i].getBindGroupLayout(0), entries});
      return [compiled[i], group, d.dispatch];
    });
    this._readBack = plan.outputs.map(o => o.nbytes ? device.createBuffer({
      size: o.nbytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST, label: `read-back ${o.name}`}) : null);
    const error = await device.popErrorScope();
    if (error) {
      throw new TflfuseError(`building the model's GPU objects failed on ${this.adapterName}: ${error.message}`);
    }
  }

  /**
   * Runs the model once.
   * @param {TypedArray[]|Object<string, TypedArray>} inputs one typed array per input (in input order, or by
   *   name): Float32Array for float32, Int32Array for int32, Uint8Array (0/1) for bool, BigInt64Array for int64;
   *   of exactly the input's element count (the values in row-major NHWC order).
   * @returns {Promise<TypedArray[]>} one typed array per output, in output order.
   * @throws {TflfuseError} an unknown, missing or extra input, a wrong array type or length (naming the input,
   *   its shape and dtype), a lost device.
   */
  run(inputs) {
    const result = this._queue.then(() => this._run(inputs));
    this._queue = result.catch(() => {});
    return result;
  }

  async _run(inputs) {
    this._checkAlive();
    const values = this._arrange(inputs);
    const {device} = this;
    device.pushErrorScope("validation");
    this.plan.inputs.forEach((spec, i) => {
      const data = toStorage(spec, values[i]);
      if (data.byteLength) device.queue.writeBuffer(this._buffers[spec.buffer], 0, data);
    });
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    for (const [pipeline, group, [x, y, z]] of this._steps) {
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(x, y, z);
    }
    pass.end();
    this.plan.outputs.forEach((o, i) => {
      if (o.nbytes) encoder.copyBufferToBuffer(this._buffers[o.buffer], 0, this._readBack[i], 0, o.nbytes);
    });
    device.queue.submit([encoder.finish()]);
    const error = await device.popErrorScope();
    if (error) throw new TflfuseError(`the run failed on ${this.adapterName}: ${error.message}`);
    try {
      await Promise.all(this._readBack.map(b => b?.mapAsync(GPUMapMode.READ)));
    } catch (e) {
      this._checkAlive();
      throw new TflfuseError(`reading the outputs back failed: ${e.message}`);
    }
    return this.plan.outputs.map((o, i) => {
      const buffer = this._readBack[i];
      const out = buffer ? fromStorage(o, buffer.getMappedRange()) : new ARRAYS[o.dtype](0);
      buffer?.unmap();
      return out;
    });
  }

  _checkAlive() {
    if (this.lost) {
      throw new TflfuseError(`the WebGPU device was lost (${this.lost.reason}: ${this.lost.message}); its buffers ` +
                             `and pipelines are gone: load the model again`);
    }
  }

  _arrange(inputs) {
    const specs = this.plan.inputs, names = specs.map(s => s.name);
    let values;
    if (Array.isArray(inputs)) {
      if (inputs.length !== specs.length) {
        throw new TflfuseError(`the model takes ${specs.length} input(s) (${names.join(", ")}), got ${inputs.length}`);
      }
      values = inputs;
    } else if (inputs && typeof inputs === "object" && !ArrayBuffer.isView(inputs)) {
      const unknown = Object.keys(inputs).filter(k => !names.includes(k));
      const known = `the model's inputs are ${names.join(", ")}`;
      if (unknown.length) throw new TflfuseError(`unknown input "${unknown[0]}"; ${known}`);
      const missing = names.filter(k => !(k in inputs));
      if (missing.length) throw new TflfuseError(`missing input "${missing[0]}"; ${known}`);
      values = names.map(k => inputs[k]);
    } else {
      throw new TflfuseError(`run() takes an array of typed arrays or an object {input name: typed array}, ` +
                             `got ${describe(inputs)}`);
    }
    values.forEach((v, i) => {
      const spec = specs[i], Type = ARRAYS[spec.dtype], count = spec.shape.reduce((a, b) => a * b, 1);
      const what = `input "${spec.name}" (shape [${spec.shape}], ${spec.dtype})`;
      if (!(v instanceof Type)) throw new TflfuseError(`${what} must be a ${Type.name}, got ${describe(v)}`);
      if (v.length !== count) throw new TflfuseError(`${what} must have ${count} values, got ${v.length}`);
    });
    return values;
  }
}

function describe(v) {
  return ArrayBuffer.isView(v) ? `a ${v.constructor.name} of ${v.length} values` : v === null ? "null" :
    Array.isArray(v) ? `an Array of ${v.length} values` : `a ${typeof v}`;
}

function hexBytes(hex) {
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.substr(2 * i, 2), 16);
  return out;
}

// The bytes an input is stored as on the GPU: f32, f16 (rounded to nearest even), or i32.
function toStorage(spec, v) {
  if (spec.storage === "f16") return float16Bits(v);
  if (spec.storage === "f32" || v instanceof Int32Array) return v;
  if (v instanceof BigInt64Array) {
    const out = new Int32Array(v.length);
    v.forEach((x, i) => {
      if (x < -(2n ** 31n) || x >= 2n ** 31n) {
        throw new TflfuseError(`input "${spec.name}" holds ${x} at ${i}: int64 tensors are held as int32 on the GPU`);
      }
      out[i] = Number(x);
    });
    return out;
  }
  return Int32Array.from(v, x => (x ? 1 : 0));   // bool
}

function fromStorage(spec, bytes) {
  const count = spec.shape.reduce((a, b) => a * b, 1);
  if (spec.storage === "f16") return float16Values(new Uint16Array(bytes, 0, count));
  if (spec.storage === "f32") return new Float32Array(bytes.slice(0, 4 * count));
  const held = new Int32Array(bytes, 0, count);
  if (spec.dtype === "int64") return BigInt64Array.from(held, x => BigInt(x));
  return spec.dtype === "bool" ? Uint8Array.from(held, x => (x ? 1 : 0)) : held.slice();
}

const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);

/** IEEE binary16 bits of float32 values, rounded to nearest even (as NumPy's astype(float16)); padded to 4 bytes. */
export function float16Bits(values) {
  const out = new Uint16Array(values.length + (values.length % 2));
  for (let i = 0; i < values.length; i++) {
    f32[0] = values[i];
    const x = u32[0], sign = (x >>> 16) & 0x8000, exp = (x >>> 23) & 0xff, man = x & 0x7fffff;
    const e = exp - 112;   // the binary16 exponent field: 127 - 15 = 112
    let h;
    if (exp === 0xff) h = 0x7c00 | (man ? 0x200 : 0);   // inf, nan
    else if (e >= 31) h = 0x7c00;                        // past 65504: inf
    else if (e <= 0) {                                   // subnormal or zero: value = m * 2**-24
      const shift = 14 - e;
      if (shift > 24) h = 0;
      else {
        const m = man | 0x800000, rest = m & ((1 << shift) - 1), half = 1 << (shift - 1);
        h = m >>> shift;
        if (rest > half || (rest === half && (h & 1))) h++;
      }
    } else {
      h = (e << 10) | (man >>> 13);
      const rest = man & 0x1fff;
      if (rest > 0x1000 || (rest === 0x1000 && (h & 1))) h++;   // a carry into the exponent is right, to inf too
    }
    out[i] = sign | h;
  }
  return out;
}

/** float32 values of IEEE binary16 bits. */
export function float16Values(bits) {
  return Float32Array.from(bits, h => {
    const sign = h & 0x8000 ? -1 : 1, e = (h >>> 10) & 0x1f, m = h & 0x3ff;
    if (e === 0) return sign * m * 2 ** -24;
    if (e === 31) return m ? NaN : sign * Infinity;
    return sign * (1 + m / 1024) * 2 ** (e - 15);
  });
}
