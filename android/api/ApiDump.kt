// The public API of compiled ExecuTorch Android classes, as JSON: what a Kotlin caller sees (each class's
// public and protected constructors, functions and properties, with parameter names, defaults, nullability
// and modality; companion members and enum entries) and what the bytecode calls (the JVM methods and fields
// those compile to: @JvmStatic copies, @JvmOverloads overloads, getters). Read with kotlin-reflect from the
// classes themselves, so the listing is what the Kotlin compiler made of the declarations, not a parse.
//
//   java -cp CLASSES:kotlin-stdlib.jar:kotlin-reflect.jar:apidump.jar ApiDumpKt PACKAGE CLASS_DIR > api.json
//
// Run by android/api/generate_listing.sh on ExecuTorch's own sources (the recorded listing) and by
// android/test.sh on android/host-stubs (compared with the listing by android/api/api_check.py).
// Members that Kotlin code of another module cannot call are left out: private, internal (public in the
// bytecode, name-mangled or not), synthetic.
import java.io.File
import java.lang.reflect.Modifier
import kotlin.reflect.KCallable
import kotlin.reflect.KClass
import kotlin.reflect.KFunction
import kotlin.reflect.KMutableProperty
import kotlin.reflect.KParameter
import kotlin.reflect.KProperty
import kotlin.reflect.KVisibility
import kotlin.reflect.full.companionObject
import kotlin.reflect.full.declaredMembers

fun main(args: Array<String>) {
    require(args.size == 2) { "usage: ApiDumpKt PACKAGE CLASS_DIR" }
    val pkg = args[0]
    val root = File(args[1])
    val names = root.walk().filter { it.isFile && it.name.endsWith(".class") }
        .map { it.relativeTo(root).path.removeSuffix(".class").replace(File.separatorChar, '.') }
        .filter { it.startsWith("$pkg.") }
        .sorted().toList()
    val out = StringBuilder("{\n")
    var first = true
    for (name in names) {
        val c = Class.forName(name, false, Thread.currentThread().contextClassLoader)
        if (c.isSynthetic || c.isAnonymousClass || c.isLocalClass) continue
        val entry = describe(c) ?: continue
        if (!first) out.append(",\n")
        first = false
        out.append("  ").append(q(c.name.replace('$', '.'))).append(": ").append(entry)
    }
    out.append("\n}\n")
    print(out)
}

fun isKotlin(c: Class<*>) = c.declaredAnnotations.any { it.annotationClass.java.name == "kotlin.Metadata" }

fun visible(m: Int) = Modifier.isPublic(m) || Modifier.isProtected(m)

/** null: a class another module's code cannot name (private, internal, a companion object itself). */
fun describe(c: Class<*>): String? {
    if (!visible(c.modifiers)) return null
    var outer = c.enclosingClass
    while (outer != null) { if (!visible(outer.modifiers)) return null; outer = outer.enclosingClass }
    val kotlin = isKotlin(c)
    val k: KClass<*>? = if (kotlin) c.kotlin else null
    if (k != null) {
        if (k.isCompanion) return null
        if (k.visibility != KVisibility.PUBLIC && k.visibility != KVisibility.PROTECTED) return null
    }
    val kind = when {
        c.isAnnotation -> "annotation class"
        c.isEnum -> "enum class"
        c.isInterface -> "interface"
        k != null && k.objectInstance != null -> "object"
        Modifier.isAbstract(c.modifiers) -> "abstract class"
        Modifier.isFinal(c.modifiers) -> "class"
        else -> "open class"
    }
    val supers = (listOfNotNull(c.superclass) + c.interfaces).map { it.name }
        .filter { it != "java.lang.Object" && it != "java.lang.Enum" && it != "java.lang.annotation.Annotation" }
    val decls = sortedSetOf<String>()
    val jvm = sortedSetOf<String>()
    if (k != null) kotlinMembers(c, k, decls, jvm) else javaMembers(c, decls, jvm)
    return "{\"language\": ${q(if (kotlin) "kotlin" else "java")}, \"kind\": ${q(kind)}, \"supertypes\": ${arr(supers)},\n" +
        "    \"declarations\": ${arr(decls)},\n    \"jvm\": ${arr(jvm)}}"
}

fun kotlinMembers(c: Class<*>, k: KClass<*>, decls: MutableSet<String>, jvm: MutableSet<String>) {
    if (c.isEnum) {
        for (e in c.enumConstants) decls.add("enum entry ${(e as Enum<*>).name}")
        for (m in c.declaredMethods) if (m.name in setOf("values", "valueOf", "getEntries") && !m.isSynthetic) jvm.add(jvmMethod(m))
        for (f in c.declaredFields) if (f.isEnumConstant) jvm.add(jvmField(f))
    }
    if (!c.isEnum && !c.isAnnotation) for (ctor in k.constructors) {
        if (!callable(ctor.visibility)) continue
        decls.add("${vis(ctor.visibility)}constructor(${params(ctor)})")
        // @JvmOverloads constructors: every JVM constructor of this visibility
        for (x in c.declaredConstructors) if (visible(x.modifiers) && !x.isSynthetic) jvm.add(jvmCtor(x))
    }
    for (m in k.declaredMembers) member("", c, m, decls, jvm)
    val comp = k.companionObject
    if (comp != null) {
        val cc = comp.java
        for (m in comp.declaredMembers) member("companion ", c, m, decls, jvm, cc)
        for (f in c.declaredFields) if (f.name == "Companion" && visible(f.modifiers)) jvm.add(jvmField(f))
    }
}

fun callable(v: KVisibility?) = v == KVisibility.PUBLIC || v == KVisibility.PROTECTED

fun vis(v: KVisibility?) = if (v == KVisibility.PROTECTED) "protected " else ""

fun modality(m: KCallable<*>) = when {
    m.isAbstract -> "abstract "
    m.isOpen -> "open "
    else -> ""
}

fun member(where: String, outer: Class<*>, m: KCallable<*>, decls: MutableSet<String>, jvm: MutableSet<String>, holder: Class<*>? = null) {
    if (!callable(m.visibility)) return
    when (m) {
        is KFunction<*> -> {
            // @JvmStatic: a static method of the name on the outer class (kotlin-reflect does not report the
            // annotation on `external` functions)
            val static = holder != null && outer.declaredMethods.any { it.name == m.name && Modifier.isStatic(it.modifiers) && visible(it.modifiers) && !it.isSynthetic }
            val ann = (if (static) "@JvmStatic " else "") + (if (m.annotations.any { it.annotationClass.java.name == "kotlin.jvm.JvmOverloads" }) "@JvmOverloads " else "")
            decls.add("$where$ann${vis(m.visibility)}${modality(m)}fun ${m.name}(${params(m)}): ${m.returnType}")
            // The JVM methods of this name in the declaring class (the @JvmOverloads ones too), and on the outer
            // class the static copies of a companion's @JvmStatic function. (By name: kotlin-reflect's
            // javaMethod cannot map some signatures of classes compiled against android.jar.)
            for (x in (holder ?: outer).declaredMethods) if (x.name == m.name && visible(x.modifiers) && !x.isSynthetic && !x.isBridge) jvm.add(jvmMethod(x, holder))
            // A function with default arguments: Kotlin callers that omit some call its synthetic static
            // `name$default` (receiver, arguments, mask, marker), part of the binary interface Kotlin code uses.
            if (m.parameters.any { it.isOptional })
                for (x in (holder ?: outer).declaredMethods) if (x.name == m.name + "\$default" && Modifier.isStatic(x.modifiers)) jvm.add(jvmMethod(x, holder))
            if (holder != null && static) for (x in outer.declaredMethods) if (x.name == m.name && Modifier.isStatic(x.modifiers) && visible(x.modifiers) && !x.isSynthetic) jvm.add(jvmMethod(x))
        }
        is KProperty<*> -> {
            val mutable = m is KMutableProperty<*>
            val const = m.isConst
            // a const or @JvmField is a visible field of the property's name (a companion's lives on the outer class)
            val fields = (outer.declaredFields + (holder?.declaredFields ?: emptyArray())).filter { it.name == m.name && visible(it.modifiers) }
            val jvmField = fields.isNotEmpty()
            val mods = (if (const) "const " else "") + (if (jvmField && !const) "@JvmField " else "")
            decls.add("$where$mods${vis(m.visibility)}${modality(m)}${if (mutable) "var" else "val"} ${m.name}: ${m.returnType}")
            for (f in fields) jvm.add(jvmField(f))
            if (!jvmField) {
                val cap = m.name.replaceFirstChar { it.uppercaseChar() }
                val getter = if (m.name.startsWith("is") && m.name.length > 2 && m.name[2].isUpperCase()) m.name else "get$cap"
                val setter = if (getter == m.name) "set" + m.name.substring(2) else "set$cap"
                for (x in (holder ?: outer).declaredMethods) if ((x.name == getter && x.parameterTypes.isEmpty() || mutable && x.name == setter && x.parameterTypes.size == 1) && visible(x.modifiers) && !x.isSynthetic)
                    jvm.add(jvmMethod(x, holder))
            }
        }
    }
}

fun params(f: KFunction<*>) = f.parameters.filter { it.kind == KParameter.Kind.VALUE }.joinToString(", ") {
    (if (it.isVararg) "vararg " else "") + "${it.name}: ${if (it.isVararg) it.type.arguments.firstOrNull()?.type ?: it.type else it.type}" + (if (it.isOptional) " = ..." else "")
}

fun javaMembers(c: Class<*>, decls: MutableSet<String>, jvm: MutableSet<String>) {
    for (x in c.declaredConstructors) if (visible(x.modifiers) && !x.isSynthetic) { jvm.add(jvmCtor(x)); decls.add("java " + jvmCtor(x)) }
    for (x in c.declaredMethods) if (visible(x.modifiers) && !x.isSynthetic && !x.isBridge) { jvm.add(jvmMethod(x)); decls.add("java " + jvmMethod(x)) }
    for (x in c.declaredFields) if (visible(x.modifiers) && !x.isSynthetic) { jvm.add(jvmField(x)); decls.add("java " + jvmField(x)) }
}

fun desc(t: Class<*>): String = when {
    t.isArray -> "[" + desc(t.componentType)
    t == Void.TYPE -> "V"
    t == java.lang.Boolean.TYPE -> "Z"
    t == java.lang.Byte.TYPE -> "B"
    t == java.lang.Character.TYPE -> "C"
    t == java.lang.Short.TYPE -> "S"
    t == java.lang.Integer.TYPE -> "I"
    t == java.lang.Long.TYPE -> "J"
    t == java.lang.Float.TYPE -> "F"
    t == java.lang.Double.TYPE -> "D"
    else -> "L" + t.name.replace('.', '/') + ";"
}

fun jmods(m: Int) = (if (Modifier.isProtected(m)) "protected " else "") + (if (Modifier.isStatic(m)) "static " else "")

/** A companion's own (non-static) method is called on the Companion instance: named by its holder class. */
fun jvmMethod(m: java.lang.reflect.Method, holder: Class<*>? = null): String =
    "${jmods(m.modifiers)}${if (holder != null && m.declaringClass == holder) "Companion." else ""}${m.name}(${m.parameterTypes.joinToString("") { desc(it) }})${desc(m.returnType)}"

fun jvmCtor(m: java.lang.reflect.Constructor<*>) = "${jmods(m.modifiers)}<init>(${m.parameterTypes.joinToString("") { desc(it) }})V"

fun jvmField(f: java.lang.reflect.Field) = "${jmods(f.modifiers)}${if (Modifier.isFinal(f.modifiers)) "final " else ""}field ${f.name}:${desc(f.type)}"

fun q(s: String) = "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\""

fun arr(xs: Collection<String>) = xs.joinToString(", ", "[", "]") { q(it) }
